"""CPU time and resident memory of another process, from /proc (Linux; no third-party package)."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid`, to the nanosecond where schedstat exists."""
    total_ns = 0
    tasks = Path(f"/proc/{pid}/task")
    try:
        for task in tasks.iterdir():
            try:
                total_ns += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return 0.0
    if total_ns:
        return total_ns / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime, in clock ticks


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (its worker processes, theirs, ...), from /proc/<pid>/task/*/children."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            for task in Path(f"/proc/{parent}/task").iterdir():
                try:
                    children = [int(child) for child in (task / "children").read_text().split()]
                except (OSError, ValueError):
                    continue
                found += children
                stack += children
        except OSError:
            continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """cpu_seconds of `pid` and every process below it (`serve --workers N`: the workers do the work)."""
    return sum(cpu_seconds(each) for each in (pid, *descendants(pid)))


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def peak_rss_mb(pid: int) -> float:
    """The resident-set high-water mark since start, or since `reset_peak`."""
    return _status_kb(pid, "VmHWM") / 1024


def reset_peak(pid: int) -> bool:
    """Restart the high-water mark at the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _cpu_fields() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def machine_busy_seconds() -> float:
    """CPU seconds spent by every process on the machine so far (all cores, idle and iowait excluded)."""
    fields = _cpu_fields()
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user/nice
    return (sum(fields) - idle - guest) / _TICKS


def machine_steal_seconds() -> float:
    """CPU seconds a virtual machine's cores were ready to run but the host ran something else (0 on
    bare metal): noise no process inside the machine shows."""
    fields = _cpu_fields()
    return fields[7] / _TICKS if len(fields) > 7 else 0.0
