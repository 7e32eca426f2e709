"""Deterministic assignment: reproducible, keyed by every input, distinct, uniform, and pinned to its algorithm."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.tasks import AssignmentError, assign, assign_problem_ids

NODE = "0x" + "ab" * 20
OTHER = "0x" + "cd" * 20


def test_same_inputs_give_the_same_problems() -> None:
    assert assign(1, NODE, 7, 3, 8, 1000) == assign(1, NODE, 7, 3, 8, 1000)


def test_address_case_does_not_matter() -> None:
    assert assign(1, NODE.upper().replace("0X", "0x"), 7, 3, 8, 1000) == assign(1, NODE, 7, 3, 8, 1000)


@pytest.mark.parametrize(
    "changed",
    [(2, NODE, 7, 3), (1, OTHER, 7, 3), (1, NODE, 8, 3), (1, NODE, 7, 4)],
    ids=["pool", "node", "step", "counter"],
)
def test_each_input_changes_the_problems(changed: tuple[int, str, int, int]) -> None:
    pool, node, step, counter = changed
    assert assign(pool, node, step, counter, 8, 1000) != assign(1, NODE, 7, 3, 8, 1000)


def test_algorithm_is_pinned() -> None:
    """Changing the draw would make validators reject every honest file written before the change."""
    assert assign(1, NODE, 0, 0, 6, 100) == PINNED


PINNED = [21, 55, 56, 97, 84, 68]


def reference_assign(pool: int, node: str, step: int, counter: int, n: int, num_problems: int) -> list[int]:
    """The draw written out plainly: a full Fisher-Yates over a list, with the 256-bit hash as randomness."""
    key = (
        b"prime-node/assign/v1"
        + pool.to_bytes(32, "big")
        + bytes.fromhex(node[2:].lower())
        + step.to_bytes(8, "big")
        + counter.to_bytes(8, "big")
    )
    order = list(range(num_problems))
    for position in range(n):
        digest = hashlib.sha256(key + position.to_bytes(8, "big") + (0).to_bytes(4, "big")).digest()
        target = position + int.from_bytes(digest, "big") % (num_problems - position)
        order[position], order[target] = order[target], order[position]
    return order[:n]


@pytest.mark.parametrize(("n", "num_problems"), [(6, 100), (10, 10), (3, 7), (64, 10_000)])
def test_sparse_shuffle_equals_a_plain_fisher_yates(n: int, num_problems: int) -> None:
    for counter in range(20):
        assert assign(5, OTHER, 9, counter, n, num_problems) == reference_assign(5, OTHER, 9, counter, n, num_problems)


@settings(max_examples=200, deadline=None)
@given(
    pool=st.integers(0, 2**256 - 1),
    step=st.integers(0, 2**64 - 1),
    counter=st.integers(0, 2**64 - 1),
    num_problems=st.integers(1, 500),
    data=st.data(),
)
def test_indices_are_distinct_and_in_range(
    pool: int, step: int, counter: int, num_problems: int, data: st.DataObject
) -> None:
    n = data.draw(st.integers(0, min(num_problems, 40)))
    drawn = assign(pool, NODE, step, counter, n, num_problems)
    assert len(drawn) == n == len(set(drawn))
    assert all(0 <= i < num_problems for i in drawn)


def test_drawing_every_problem_is_a_permutation() -> None:
    assert sorted(assign(1, NODE, 0, 0, 50, 50)) == list(range(50))


def test_problems_are_drawn_uniformly() -> None:
    """Each of 20 problems is drawn equally often overall and in the first position (chi-square, 19 dof)."""
    problems, draws = 20, 4000
    overall: Counter[int] = Counter()
    first: Counter[int] = Counter()
    for counter in range(draws):
        drawn = assign(3, NODE, 11, counter, 5, problems)
        overall.update(drawn)
        first[drawn[0]] += 1
    for counts, total in ((overall, draws * 5), (first, draws)):
        expected = total / problems
        chi2 = sum((counts[i] - expected) ** 2 / expected for i in range(problems))
        assert chi2 < 43.8, (chi2, counts)  # p = 0.001 for 19 degrees of freedom


def test_ids_follow_the_source_order() -> None:
    ids = [f"p{i}" for i in range(30)]
    assert assign_problem_ids(ids, 1, NODE, 2, 0, 4) == [ids[i] for i in assign(1, NODE, 2, 0, 4, 30)]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1, "node-a", 0, 0, 1, 10), "address"),
        ((1, "0x" + "ab" * 19, 0, 0, 1, 10), "address"),
        ((1, "ab" * 21, 0, 0, 1, 10), "address"),
        ((-1, NODE, 0, 0, 1, 10), "pool_id"),
        ((1, NODE, -1, 0, 1, 10), "step"),
        ((1, NODE, 0, 2**64, 1, 10), "counter"),
        ((1, NODE, 0, 0, 11, 10), "n=11"),
        ((1, NODE, 0, 0, -1, 10), "n=-1"),
        ((1, NODE, 0, 0, 0, 0), "at least one"),
    ],
)
def test_bad_arguments_are_refused(args: tuple[int, str, int, int, int, int], match: str) -> None:
    with pytest.raises(AssignmentError, match=match):
        assign(*args)


def test_zero_problems_requested_is_empty() -> None:
    assert assign(1, NODE, 0, 0, 0, 10) == []
