"""What this host has free (core.hostmemory): MemAvailable, a cgroup's limit read from real files, a budget; sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import InputError
from core.hostmemory import _cgroup_free, format_size, free_memory, memory_totals, parse_size, process_rss


def test_free_ram_is_memavailable_or_less_and_a_budget_replaces_it() -> None:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    free = free_memory("cpu")
    assert free.total == total == memory_totals()["cpu"] and 0 < free.bytes <= total
    assert free.source in ("MemAvailable", "the cgroup's memory limit")
    budget = free_memory("cpu", budget=123 << 20)
    assert (budget.bytes, budget.total, budget.source) == (123 << 20, total, "--memory-budget")
    assert 0 < process_rss() < total


def cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_cgroup_limit_counts_what_is_used_under_it_less_the_page_cache_it_can_drop(tmp_path: Path) -> None:
    v2 = cgroup(tmp_path / "v2", {"memory.max": "4294967296\n", "memory.current": "3221225472\n",
                                  "memory.stat": "anon 2147483648\ninactive_file 1073741824\n"})  # fmt: skip
    assert _cgroup_free(v2) == (4 << 30) - (3 << 30) + (1 << 30)
    unlimited = cgroup(tmp_path / "max", {"memory.max": "max\n", "memory.current": "1\n", "memory.stat": ""})
    assert _cgroup_free(unlimited) is None
    v1 = cgroup(tmp_path / "v1", {"memory/memory.limit_in_bytes": str(2 << 30), "memory/memory.usage_in_bytes":
                                  str(1 << 30), "memory/memory.stat": "total_inactive_file 0\n"})  # fmt: skip
    assert _cgroup_free(v1) == 1 << 30
    no_limit = str((1 << 63) - 4096)  # how cgroup v1 writes "no limit"
    files = {"memory/memory.limit_in_bytes": no_limit, "memory/memory.usage_in_bytes": "1", "memory/memory.stat": ""}
    v1_unlimited = cgroup(tmp_path / "v1u", files)
    assert _cgroup_free(v1_unlimited) is None
    assert _cgroup_free(tmp_path / "none") is None


@pytest.mark.parametrize(
    ("text", "size"),
    [("512MiB", 512 << 20), ("2GiB", 2 << 30), ("2G", 2 << 30), ("1.5 GiB", 3 << 29), ("800MB", 800_000_000),
     ("1000000", 1_000_000), ("64k", 65_536)],
)  # fmt: skip
def test_sizes_parse_in_binary_units_unless_written_in_decimal_ones(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "-1", "lots", "2PB", ""])
def test_a_size_that_is_not_one_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(InputError, match=r"--memory-budget: .* is not a positive size"):
        parse_size(text)


def test_sizes_print_in_the_largest_unit_that_keeps_them_readable() -> None:
    assert [format_size(n) for n in (0, 1, 5 << 10, 390 << 20, (18 << 30) // 10)] == [
        "0 B", "1 KiB", "5 KiB", "390 MiB", "1.8 GiB",
    ]  # fmt: skip
