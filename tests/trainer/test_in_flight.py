"""trainer.in_flight: what the pool has handed out that may still be trained on."""

from __future__ import annotations

from trainer.in_flight import FilesInFlight


def test_an_assignment_counts_until_trained_vetoed_or_out_of_the_window() -> None:
    flying = FilesInFlight(async_level=2)
    for counter, step in enumerate((0, 0, 1, 1, 2)):
        flying.issued("a", counter, step)
    assert flying.count(2) == 5
    flying.settle([("a", 0), ("a", 99)])  # trained on; an assignment never handed out changes nothing
    assert flying.count(2) == 4
    flying.uploaded(b"k1", "a", 1)
    flying.uploaded(b"zz", "b", 7)  # not handed out here (an earlier run's): never counted, never kept
    flying.vetoed(b"k1")
    flying.vetoed(b"zz")
    assert flying.count(2) == 3
    assert flying.count(3) == 3  # the window of step 3 still holds step 1
    assert flying.count(4) == 1  # step 4's holds only step 2
    assert flying.count(5) == 0


def test_what_it_keeps_shrinks_with_what_is_in_flight() -> None:
    flying = FilesInFlight(async_level=1)
    for counter in range(1000):
        flying.issued("a", counter, counter // 10)
        flying.uploaded(counter.to_bytes(4, "big"), "a", counter)
    assert flying.count(99) == 20  # steps 98 and 99
    assert len(flying._keys) == 20 and len(flying._steps) == 20
