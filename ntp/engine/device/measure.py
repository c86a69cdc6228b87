"""Measuring this process: peak memory per phase (device or host), host PSS, the C heap, and the clock of
collectives in flight while this rank computes; all reported in the worker records."""

from __future__ import annotations

import re
import resource
import time
from dataclasses import dataclass

import torch

from ntp.engine.device.host_heap import release_free_heap


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timing a CUDA collective or kernel)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_device_bytes(device: torch.device) -> int:
    """Free memory of a CUDA device (0 for the CPU: nothing to fit into)."""
    if device.type != "cuda":
        return 0
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA peak allocated on GPU; peak RSS of this process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def host_pss_bytes() -> int:
    """This process's proportional set size: private pages plus its share of pages shared with other processes
    (the topology the ranks of a node share). Summed over a node's processes it is the node's resident memory,
    each shared page counted once; 0 where /proc/self/smaps_rollup does not exist."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PhaseMemory:
    """Peak memory per phase ("nn", "propagate"): CUDA peak allocated, or the process's peak RSS (VmHWM, reset
    through /proc/self/clear_refs) on CPU. :meth:`enter` closes the running phase and opens another.

    On CPU, free heap pages are returned to the system (malloc_trim) once per epoch, in :meth:`reset`: doing it at
    every phase switch made the next large allocations page-fault again (tens of ms per switch)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peaks: dict[str, int] = {}
        self.phase = "nn"
        self._cpu_ok = device.type != "cuda" and _can_reset_rss()

    def reset(self) -> None:
        self.peaks.clear()
        self.phase = "nn"
        if self._cpu_ok:
            release_free_heap()
        self._reset_peak()

    def release_free_heap(self) -> None:
        if self._cpu_ok:
            release_free_heap()

    def enter(self, phase: str) -> str:
        """Switch to ``phase``; returns the phase that was running (to switch back)."""
        previous = self.phase
        if phase != previous:
            self._close()
            self.phase = phase
        return previous

    def snapshot(self) -> dict[str, int]:
        self._close()
        return dict(self.peaks)

    def _close(self) -> None:
        peak = self._peak()
        if peak is not None:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), peak)
        self._reset_peak()

    def _peak(self) -> int | None:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        if not self._cpu_ok:
            return None
        return _vm_hwm()

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._cpu_ok:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        match = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    return int(match.group(1)) * 1024 if match else 0


def _can_reset_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _vm_hwm() > 0
    except OSError:
        return False


class in_phase:
    """``with in_phase(phases, "propagate"):`` counts the enclosed work in that phase, then returns to the previous
    one (a no-op when ``phases`` is None)."""

    def __init__(self, phases: PhaseMemory | None, name: str = "propagate") -> None:
        self.phases, self.name, self.previous = phases, name, None

    def __enter__(self) -> None:
        if self.phases is not None:
            self.previous = self.phases.enter(self.name)

    def __exit__(self, *exc) -> None:
        if self.phases is not None:
            self.phases.enter(self.previous)


@dataclass
class OverlapClock:
    """Time asynchronous collectives were in flight while this rank computed (summed over collectives)."""

    overlap_s: float = 0.0
    async_calls: int = 0

    def reset(self) -> None:
        self.overlap_s, self.async_calls = 0.0, 0


def now() -> float:
    return time.perf_counter()


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n}B"


def budget_text(n: int) -> str:
    """``n`` bytes as a --memory-budget value that holds them: 3 significant digits rounded up, in the decimal units
    the option reads (format_bytes rounds, in binary units, and may read back as less)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            exp = len(str(n // size)) - 1  # digits before the point, less one
            step = size * 10**exp // 100  # the third significant digit, in bytes
            up = -(-n // step) * step
            return f"{up / size:.{max(2 - exp, 0)}f}{unit}"
    return f"{n}B"
