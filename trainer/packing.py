"""Packing sequences into micro-batches under a token budget: first-fit-decreasing (DESIGN section 8).

A micro-batch costs about its total token count (sum of its sequences' lengths), so bins are filled up to
`budget` tokens. Pure Python over lengths; the caller turns each bin of indices into a padded batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer.errors import TrainerError


class SequenceTooLongError(TrainerError):
    """One sequence alone is over the micro-batch token budget, so no packing can hold it."""

    def __init__(self, index: int, length: int, budget: int) -> None:
        super().__init__(
            f"sequence {index} has {length} tokens, more than the micro-batch budget of {budget}; "
            "raise the budget or cap prompt + completion length"
        )
        self.index = index
        self.length = length
        self.budget = budget


def _check(lengths: Sequence[int], budget: int) -> None:
    if budget < 1:
        raise ValueError(f"the token budget must be >= 1, got {budget}")
    for index, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"sequence {index} has a negative length {length}")
        if length > budget:
            raise SequenceTooLongError(index, length, budget)


def pack_first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of `lengths`, grouped into bins whose summed lengths are each at most `budget`.

    First-fit-decreasing: sequences are taken longest first (equal lengths by ascending index, so the
    result depends on the lengths only and is deterministic), and each goes into the earliest-opened bin
    that still has room. Bins come out in the order they were opened, and hold their indices in the
    order placed. Every index appears in exactly one bin; an empty input gives no bins.

    Bound (Dosa 2007, tight): FFD uses at most 11/9 * OPT + 6/9 bins, OPT being the fewest bins any
    packing needs. It is not optimal, and not even always better than first-fit in a lucky order: lengths
    [5, 3, 2, 4, 3, 3] with budget 10 fit two bins in input order, FFD opens three.

    Cost: O(n log n + n * bins), fine for the thousands of sequences of one step.

    Raises `SequenceTooLongError` when one length exceeds `budget`, and ValueError for a budget below 1
    or a negative length.
    """
    _check(lengths, budget)
    bins: list[list[int]] = []
    free: list[int] = []  # free[b]: tokens still unused in bins[b]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        for b, room in enumerate(free):
            if length <= room:
                bins[b].append(index)
                free[b] -= length
                break
        else:  # no open bin has room
            bins.append([index])
            free.append(budget - length)
    return bins
