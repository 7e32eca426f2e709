"""Acceptance 1: honest files are accepted, whatever the batch size, group size, padding or assignment inputs.

50 files: every group size 1..8 at worker batch sizes 1, 4 and 16 (16 with at least 16 rows, so batches are
full and left-padded), then 26 more from other pools, steps, counters and nodes. The validator's own prefill
batch size varies too (1, 5, 16), so neither side's batch composition may change a proof or a sampled token.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from engine.generate import Generated
from protocol.rollouts import encode_rollouts, work_units
from validator.config import ValidatorConfig
from validator.verdict import Verdict

OTHER_NODES = (
    "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1",
    "0xFFcf8FDEE72ac11b5c542428B35EEF5769C409f0",
    "0x22d491Bde2303f2f43325b2108D26f1eAbA1e32b",
)
PREFILL_BATCHES = (1, 5, 16)


@dataclass(frozen=True)
class Case:
    batch_size: int
    prompts: int
    group: int
    counter: int
    step: int = 0
    pool: int = 0
    node: str = OTHER_NODES[0]

    @property
    def id(self) -> str:
        return f"b{self.batch_size}-p{self.prompts}-g{self.group}-c{self.counter}-s{self.step}-pool{self.pool}"


def _cases() -> list[Case]:
    cases = [Case(1, 1, group, counter=group) for group in range(1, 9)]
    cases += [Case(4, 2, group, counter=10 + group) for group in range(1, 9)]
    cases += [Case(16, -(-16 // group), group, counter=20 + group) for group in range(1, 9)]  # >= 16 rows
    for i in range(26):  # other assignment inputs; small files
        cases.append(
            Case(
                batch_size=(1, 4, 16)[i % 3],
                prompts=1 + i % 2,
                group=1 + i % 4,
                counter=100 + i,
                step=i % 5,
                pool=i % 3,
                node=OTHER_NODES[i % len(OTHER_NODES)],
            )
        )
    return cases


CASES = _cases()
timings: dict[str, list[float]] = {"generate": [], "verify": []}
worst: list[dict[str, float]] = []  # each accepted file's largest TOPLOC statistics


def test_the_honest_set_covers_50_files_batch_sizes_and_group_sizes() -> None:
    assert len(CASES) >= 50
    assert {case.batch_size for case in CASES} == {1, 4, 16}
    assert {case.group for case in CASES} == set(range(1, 9))
    assert len({(case.pool, case.node, case.step, case.counter) for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_an_honest_file_is_accepted(
    case: Case, generate: Callable[..., Generated], verify: Callable[..., Verdict]
) -> None:
    started = time.perf_counter()
    generated = generate(
        counter=case.counter,
        prompts=case.prompts,
        group=case.group,
        batch_size=case.batch_size,
        step=case.step,
        pool=case.pool,
        node=case.node,
    )
    data = encode_rollouts(generated.meta, generated.rows)
    timings["generate"].append(time.perf_counter() - started)
    config = ValidatorConfig(prefill_batch_size=PREFILL_BATCHES[case.counter % len(PREFILL_BATCHES)])

    started = time.perf_counter()
    verdict = verify(
        data,
        config,
        work_key=hashlib.sha256(data).digest(),
        node=case.node.lower(),  # the chain reports addresses in any case
        pool_id=case.pool,
        units=work_units(generated.rows),
        current_step=case.step + case.counter % 3,  # the file may lag the pool by up to async_level steps
    )
    timings["verify"].append(time.perf_counter() - started)

    assert verdict.accepted, verdict.to_json()
    assert verdict.evidence["rows"] == case.prompts * case.group
    assert verdict.evidence["units"] == work_units(generated.rows)
    worst.append(verdict.evidence["proof_worst"])


def test_verification_is_cheaper_than_generation() -> None:
    """Runs after the honest files (definition order); skipped when they were deselected."""
    if len(timings["verify"]) < 10:
        pytest.skip("needs the honest files of this module")
    generate_s, verify_s = sum(timings["generate"]), sum(timings["verify"])
    largest = {name: max(file[name] for file in worst) for name in worst[0]}
    print(f"\nhonest set: {len(timings['verify'])} files, generation {generate_s:.1f} s, verification {verify_s:.1f} s")
    print(f"largest TOPLOC statistics of any honest chunk: {largest}")
    assert verify_s < generate_s
