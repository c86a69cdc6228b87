"""A progress bar under the streamed worker output, for an interactive terminal.

``line(text)`` prints a line of output above the bar; the bar itself follows the epoch records (it is a consumer
of ntp.run.tracking.live.ResultsFollower): ``[#########-----------] 45/100 epochs  loss 0.4213  ETA 0:00:12``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from ntp.engine.train.sinks import format_duration
from ntp.records import EpochRecord, Record

WIDTH = 30


class ProgressBar:
    def __init__(self, total_epochs: int, stream: TextIO | None = None) -> None:
        self.total = total_epochs
        self.stream = stream or sys.stdout
        self.done = 0
        self.loss: float | None = None
        self.t0 = time.perf_counter()
        self.first_done: int | None = None
        self._lock = threading.Lock()
        self._shown = False

    @staticmethod
    def wanted(stream: TextIO | None = None) -> bool:
        """Only where a person watches: an interactive terminal."""
        s = stream or sys.stdout
        return hasattr(s, "isatty") and s.isatty()

    def line(self, text: str) -> None:
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self._draw()

    def __call__(self, records: Sequence[Record]) -> None:
        epochs = [r for r in records if isinstance(r, EpochRecord)]
        if not epochs:
            return
        with self._lock:
            if self.first_done is None:
                self.first_done, self.t0 = epochs[0].epoch, time.perf_counter()
            self.done = epochs[-1].epoch + 1
            self.loss = epochs[-1].loss
            self._clear()
            self._draw()

    def close(self) -> None:
        with self._lock:
            self._clear()
            self.stream.flush()

    def render(self) -> str:
        filled = int(WIDTH * self.done / max(self.total, 1))
        text = f"[{'#' * filled}{'-' * (WIDTH - filled)}] {self.done}/{self.total} epochs"
        if self.loss is not None:
            text += f"  loss {self.loss:.4f}"
        if self.first_done is not None and self.done > self.first_done:
            per_epoch = (time.perf_counter() - self.t0) / (self.done - self.first_done)
            text += f"  ETA {format_duration(per_epoch * (self.total - self.done))}"
        return text

    def _draw(self) -> None:
        self.stream.write(self.render())
        self.stream.flush()
        self._shown = True

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\033[2K")
            self._shown = False
