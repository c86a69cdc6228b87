"""Communication instrumentation: seconds, bytes and calls per kind of collective (the worker records' traffic)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ntp.engine.device.measure import synchronize

#: Communication kinds reported in the results file.
SPLIT, GATHER, ALLREDUCE, ATTENTION, HALO = "split", "gather", "allreduce", "attention", "halo"
#: Gathers of learnable embedding tables (ntp.engine.nn.embedding) for checkpoints.
EMBEDDING = "embedding"


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
        synchronize(device)
        t0 = time.perf_counter()
        yield
        synchronize(device)
        self.add(kind, time.perf_counter() - t0, sent, recv)
