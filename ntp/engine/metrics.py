"""Per-worker instrumentation: communication time and bytes per kind, compute time, peak memory."""
from __future__ import annotations

import resource
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

#: Communication kinds reported in the results file.
SPLIT, GATHER, ALLREDUCE, ATTENTION, HALO = "split", "gather", "allreduce", "attention", "halo"


@dataclass
class CommStats:
    """Seconds and bytes per communication kind since the last reset."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_recv: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def reset(self) -> None:
        for d in (self.seconds, self.bytes_sent, self.bytes_recv, self.calls):
            d.clear()

    def add(self, kind: str, seconds: float, sent: int, recv: int) -> None:
        self.seconds[kind] += seconds
        self.bytes_sent[kind] += sent
        self.bytes_recv[kind] += recv
        self.calls[kind] += 1

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @contextmanager
    def timed(self, kind: str, sent: int, recv: int, device: torch.device) -> Iterator[None]:
        _sync(device)
        t0 = time.perf_counter()
        yield
        _sync(device)
        self.add(kind, time.perf_counter() - t0, sent, recv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
