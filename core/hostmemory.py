"""What this host has free: its RAM (MemAvailable, or less under a cgroup's memory limit) and a GPU's
(`torch.cuda.mem_get_info`); sizes in bytes, printed and parsed. `engine.memory` compares a role's need with these.

On CPU, MemAvailable counts what the kernel can hand out without swapping (free pages and the page cache it can drop);
in a container whose cgroup has a limit, what is left under the limit is what counts, its reclaimable file pages
(inactive_file) not held against it, as `docker stats` reads it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.errors import InputError

Memory = Literal["cpu", "cuda"]  # this host's RAM, or a GPU's memory
MIB, GIB = 1 << 20, 1 << 30
BUDGET_SOURCE = "--memory-budget"  # how a budget that replaced what is free is named
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(i?)(b?))?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Free:
    memory: Memory
    bytes: int
    total: int
    source: str  # where the figure comes from: MemAvailable, the cgroup's limit, mem_get_info, a budget


def memory_totals(*, device_index: int = 0) -> dict[Memory, int]:
    """The size of each memory here: the RAM, and the GPU's when torch sees one (vLLM takes shares of these)."""
    totals: dict[Memory, int] = {"cpu": _meminfo()["MemTotal"]}
    import torch

    if torch.cuda.is_available():
        totals["cuda"] = int(torch.cuda.mem_get_info(device_index)[1])
    return totals


def free_memory(memory: Memory, *, budget: int | None = None, device_index: int = 0) -> Free:
    """What is free in `memory` now (module docstring); a `budget` given replaces it (`--memory-budget`)."""
    if memory == "cuda":
        import torch

        free, total = (int(n) for n in torch.cuda.mem_get_info(device_index))
        source = "torch.cuda.mem_get_info"
    else:
        info = _meminfo()
        free, total, source = info["MemAvailable"], info["MemTotal"], "MemAvailable"
        cgroup = _cgroup_free()
        if cgroup is not None and cgroup < free:
            free, source = cgroup, "the cgroup's memory limit"
    if budget is not None:
        return Free(memory, budget, total, BUDGET_SOURCE)
    return Free(memory, free, total, source)


def process_rss() -> int:
    """The bytes this process holds in RAM now (VmRSS); 0 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0  # no /proc, or a line it cannot read: nothing to say
    return 0


def _meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def _cgroup_free(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The limit of this process's cgroup less what it uses, page cache it could drop not counted; None without a
    limit. cgroup v2 (memory.max) or v1 (memory/memory.limit_in_bytes)."""
    for limit_file, usage_file, stat_file, inactive in (
        (root / "memory.max", root / "memory.current", root / "memory.stat", "inactive_file"),
        (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes",
         root / "memory" / "memory.stat", "total_inactive_file"),
    ):  # fmt: skip
        try:
            limit_text = limit_file.read_text().strip()
            if limit_text == "max" or int(limit_text) >= 1 << 60:  # v1 writes "no limit" as a huge number
                return None
            usage = int(usage_file.read_text().strip())
            stat = dict(line.split() for line in stat_file.read_text().splitlines() if line.count(" ") == 1)
        except (OSError, ValueError):
            continue
        return max(0, int(limit_text) - (usage - int(stat.get(inactive, 0))))
    return None


# --- sizes ------------------------------------------------------------------------------------------------------------


def format_size(n: int) -> str:
    """1.8 GiB, 390 MiB, 12 KiB, 0 B."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{math.ceil(n / 1024)} KiB" if n else "0 B"


def parse_size(text: str, *, what: str = "--memory-budget") -> int:
    """'512MiB', '2GiB', '2G', '800MB', '1000000' -> bytes: K, M, G, T count in 1024s (KiB, MiB, GiB, TiB; bare, as
    ulimit and Docker read them), KB, MB, GB, TB in 1000s; a bare number is bytes."""
    match = _SIZE.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise InputError(f"{what}: {text!r} is not a positive size (e.g. 512MiB, 2GiB, 800MB)")
    number, unit, binary, byte = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    base = 1000 if byte and not binary else 1024
    return int(float(number) * base**power)
