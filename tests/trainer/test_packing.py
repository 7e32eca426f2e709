"""First-fit-decreasing packing: hand-checked packings, its invariants, its bound, and its errors."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.errors import TrainerError
from trainer.packing import SequenceTooLongError, pack_first_fit_decreasing


def first_fit_in_order(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Reference first-fit over the input order, written independently of the module."""
    bins: list[list[int]] = []
    for index, length in enumerate(lengths):
        target = next((b for b in bins if sum(lengths[i] for i in b) + length <= budget), None)
        if target is None:
            bins.append([index])
        else:
            target.append(index)
    return bins


def optimum(lengths: Sequence[int], budget: int) -> int:
    """Fewest bins of any packing, by exhaustive search (small inputs only)."""
    items = sorted(lengths, reverse=True)
    for count in range(math.ceil(sum(items) / budget), len(items) + 1):
        loads = [0] * count

        def place(k: int, loads: list[int] = loads) -> bool:
            if k == len(items):
                return True
            tried: set[int] = set()
            for b in range(len(loads)):
                if loads[b] + items[k] <= budget and loads[b] not in tried:  # equal loads are symmetric
                    tried.add(loads[b])
                    loads[b] += items[k]
                    if place(k + 1):
                        return True
                    loads[b] -= items[k]
            return False

        if place(0):
            return count
    return 0  # no items


def assert_valid(bins: list[list[int]], lengths: Sequence[int], budget: int) -> None:
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))  # each index exactly once
    assert all(b for b in bins)  # no empty bin
    assert all(sum(lengths[i] for i in b) <= budget for b in bins)


def test_packs_the_hand_checked_example_exactly() -> None:
    # 6 opens bin 0; 5 does not fit there (11) and opens bin 1; the next 5 fills bin 1; 4 fills bin 0;
    # 3 opens bin 2 and 2 joins it.
    assert pack_first_fit_decreasing([6, 5, 5, 4, 3, 2], 10) == [[0, 3], [1, 2], [4, 5]]


def test_sorts_by_length_whatever_the_input_order() -> None:
    assert pack_first_fit_decreasing([2, 3, 4, 5, 5, 6], 10) == [[5, 2], [3, 4], [1, 0]]


def test_breaks_ties_by_the_original_index() -> None:
    assert pack_first_fit_decreasing([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert pack_first_fit_decreasing([3, 5, 3, 5], 8) == [[1, 0], [3, 2]]


def test_a_sequence_exactly_at_the_budget_gets_a_bin_of_its_own() -> None:
    assert pack_first_fit_decreasing([1, 10, 9], 10) == [[1], [2, 0]]


def test_empty_input_gives_no_bins() -> None:
    assert pack_first_fit_decreasing([], 10) == []


def test_a_sequence_over_the_budget_is_refused_with_its_index_and_length() -> None:
    with pytest.raises(SequenceTooLongError, match="sequence 2 has 11 tokens, more than the micro-batch budget of 10"):
        pack_first_fit_decreasing([3, 10, 11, 12], 10)  # the first offender in input order is named
    assert issubclass(SequenceTooLongError, TrainerError)


@pytest.mark.parametrize(("lengths", "budget"), [([1], 0), ([-1, 2], 10)])
def test_a_nonpositive_budget_or_negative_length_is_a_value_error(lengths: list[int], budget: int) -> None:
    with pytest.raises(ValueError):
        pack_first_fit_decreasing(lengths, budget)


def test_first_fit_in_a_lucky_order_can_beat_ffd() -> None:
    # Why FFD is not checked against first-fit in input order: this order packs into 2 bins, FFD into 3.
    lengths = [5, 3, 2, 4, 3, 3]
    assert len(first_fit_in_order(lengths, 10)) == 2 == optimum(lengths, 10)
    assert len(pack_first_fit_decreasing(lengths, 10)) == 3


def test_ffd_beats_first_fit_in_input_order_on_ascending_lengths() -> None:
    lengths = [2, 2, 2, 3, 3, 8, 8, 8]  # ascending order strands the 8s: 5 bins; FFD pairs each 8 with a 2
    assert len(first_fit_in_order(lengths, 10)) == 5
    assert pack_first_fit_decreasing(lengths, 10) == [[5, 0], [6, 1], [7, 2], [3, 4]]


budgets = st.integers(min_value=1, max_value=64)


@st.composite
def instances(draw: st.DrawFn, max_items: int = 40) -> tuple[list[int], int]:
    budget = draw(budgets)
    lengths = draw(st.lists(st.integers(min_value=0, max_value=budget), max_size=max_items))
    return lengths, budget


@settings(max_examples=300, deadline=None)
@given(instances())
def test_every_index_lands_once_and_no_bin_is_over_budget(instance: tuple[list[int], int]) -> None:
    lengths, budget = instance
    bins = pack_first_fit_decreasing(lengths, budget)
    assert_valid(bins, lengths, budget)
    assert bins == pack_first_fit_decreasing(list(lengths), budget)  # deterministic
    # any first-fit packing leaves at most one bin half full or less, so it is near the volume bound
    assert sum(2 * sum(lengths[i] for i in b) <= budget for b in bins) <= 1


@settings(max_examples=300, deadline=None)
@given(instances(max_items=8))
def test_bins_stay_within_the_ffd_bound_of_the_optimum(instance: tuple[list[int], int]) -> None:
    lengths, budget = instance
    assert len(pack_first_fit_decreasing(lengths, budget)) <= 11 / 9 * optimum(lengths, budget) + 6 / 9


@settings(max_examples=200, deadline=None)
@given(instances(), st.randoms(use_true_random=False))
def test_the_packing_depends_only_on_the_multiset_of_lengths(
    instance: tuple[list[int], int], rng: random.Random
) -> None:
    lengths, budget = instance
    shuffled = list(range(len(lengths)))
    rng.shuffle(shuffled)
    permuted = [lengths[i] for i in shuffled]
    as_lengths = [[lengths[i] for i in b] for b in pack_first_fit_decreasing(lengths, budget)]
    assert as_lengths == [[permuted[i] for i in b] for b in pack_first_fit_decreasing(permuted, budget)]
