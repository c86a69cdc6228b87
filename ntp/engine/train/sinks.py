"""Where rank 0 writes its records: the JSON-lines results file and the console (one line per epoch).

A sink has three methods: ``start(history)`` (records already written before a resume), ``write(record)`` and
``close()``. The driver follows the results file into MLflow as it grows (ntp.run.tracking.live), so training never
waits for a tracking server.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Protocol, TextIO

from ntp.config import TrainConfig
from ntp.records import EpochRecord, FinalRecord, Record, to_json


class RecordSink(Protocol):
    def start(self, history: list[EpochRecord]) -> None: ...

    def write(self, record: Record) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON line per record, flushed at once (a follower sees each epoch as it ends). On resume the file is
    rewritten from the checkpoint's history, so it reads like an uninterrupted run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.file: TextIO | None = None

    def start(self, history: list[EpochRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")
        for rec in history:
            self.write(rec)

    def write(self, record: Record) -> None:
        assert self.file is not None, "start() first"
        self.file.write(to_json(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class ConsoleSink:
    """``epoch 12/100  loss 0.5321  train 0.8123  valid 0.7712  test 0.7650  0.021 s/epoch  ETA 0:00:02``, then the
    per-worker summary and the final metric."""

    def __init__(self, epochs: int, stream: TextIO | None = None) -> None:
        self.epochs = epochs
        self.stream = stream or sys.stdout
        self.history: list[EpochRecord] = []
        self.t0 = time.perf_counter()
        self.first = 0

    def start(self, history: list[EpochRecord]) -> None:
        self.history = list(history)
        self.first = len(history)
        self.t0 = time.perf_counter()

    def write(self, record: Record) -> None:
        if isinstance(record, EpochRecord):
            self.history.append(record)
            self._print(epoch_line(record, self.epochs, self._eta(record)))
        else:
            self._print(summary_table(self.history))
            self._print(final_line(record))

    def close(self) -> None:
        self.stream.flush()

    def _eta(self, record: EpochRecord) -> float:
        done = len(self.history) - self.first
        per_epoch = (time.perf_counter() - self.t0) / max(done, 1)
        return per_epoch * max(self.epochs - record.epoch - 1, 0)

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


def epoch_line(record: EpochRecord, epochs: int, eta_s: float) -> str:
    metrics = "".join(f"  {name} {value:.4f}" for name, value in record.metrics().items())
    if record.valid_loss is not None:
        metrics += f"  valid loss {record.valid_loss:.4f}"
    width = len(str(epochs))
    return (
        f"epoch {record.epoch + 1:>{width}}/{epochs}  loss {record.loss:.4f}{metrics}  "
        f"{record.epoch_s:.3f} s/epoch  ETA {format_duration(eta_s)}"
    )


def final_line(final: FinalRecord) -> str:
    if final.test_metric is None:
        return f"done: {final.epochs_run} epochs, no evaluation improved on the first (metric {final.metric})"
    return (
        f"done: test {final.metric} {final.test_metric:.4f} at {final.kept_at()}, {final.epochs_run} epochs on "
        f"{final.world_size} rank(s)"
    )


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def summary_table(history: list[EpochRecord]) -> str:
    """Per-worker compute and communication, like Table 2 of the NeutronTP paper (means over epochs)."""
    if not history:
        return "no epochs run"
    ranks = len(history[0].workers)
    compute = [statistics.mean(h.workers[r].compute_s for h in history) for r in range(ranks)]
    comm = [statistics.mean(h.workers[r].comm_total_s for h in history) for r in range(ranks)]
    sent = [statistics.mean(h.workers[r].sent_total for h in history) for r in range(ranks)]
    epoch = statistics.median(h.epoch_s for h in history)
    ratio = lambda v: max(v) / min(v) if min(v) > 0 else float("nan")  # noqa: E731
    return "\n".join(
        [
            f"{'workers':>8} {'epoch (s)':>10} {'compute max (s)':>16} {'compute min (s)':>16} {'comm max (s)':>13} "
            f"{'comm min (s)':>13} {'MB sent/rank':>13} {'bytes max/min':>14}",
            f"{ranks:>8} {epoch:>10.4f} {max(compute):>16.4f} {min(compute):>16.4f} {max(comm):>13.4f} {min(comm):>13.4f} "
            f"{statistics.mean(sent) / 1e6:>13.3f} {ratio(sent):>14.2f}",
        ]
    )


def default_sinks(cfg: TrainConfig, is_main: bool) -> list[RecordSink]:
    """Rank 0: the results file when the config names one, and the console."""
    if not is_main:
        return []
    sinks: list[RecordSink] = [ConsoleSink(cfg.epochs)]
    if cfg.results:
        sinks.insert(0, JsonlSink(cfg.results))
    return sinks
