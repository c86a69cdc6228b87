"""Live tracking: follow rank 0's results file while the job runs and hand each new record on.

Rank 0 flushes one JSON line per epoch; a background thread here reads the complete lines every ``interval_s``
and passes them, in batches, to consumers (the MLflow run, a progress bar). Training never waits for them: a slow
or failing tracking server delays the curves, not the epochs, and a consumer's error is reported once and then
skipped. Workers therefore need no MLflow at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ntp.records import EpochRecord, Record, parse_lines

Consumer = Callable[[Sequence[Record]], None]


class ResultsFollower:
    """``with ResultsFollower(path, [consumer, ...]):`` while the job runs; leaving the block delivers what is left."""

    def __init__(
        self,
        path: str | Path,
        consumers: Sequence[Consumer],
        *,
        interval_s: float = 1.0,
        warn: Callable[[str], None] = print,
    ) -> None:
        self.path = Path(path)
        self.consumers = list(consumers)
        self.interval_s = interval_s
        self.warn = warn
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ntp-results-follower", daemon=True)
        self._failed: set[int] = set()

    def __enter__(self) -> "ResultsFollower":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # whatever the job wrote last

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        """Deliver the records completed since the last poll."""
        records = parse_lines(self._new_lines())
        if not records:
            return
        for i, consume in enumerate(self.consumers):
            if i in self._failed:
                continue
            try:
                consume(records)
            except Exception as exc:  # tracking must never stop training
                self._failed.add(i)
                self.warn(
                    f"warning: live tracking stopped ({type(exc).__name__}: {exc}); the run is logged when it ends"
                )

    def _new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:  # rewritten (a resumed job replays its history): start over
            self._offset, self._partial = 0, b""
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for its end
        return [line.decode("utf-8", "replace") for line in lines]


class EpochLogger:
    """A consumer that logs each epoch once to a run's per-epoch metrics (``log_epochs(records)``)."""

    def __init__(self, run: object) -> None:
        self.run = run
        self.logged: set[int] = set()

    def __call__(self, records: Sequence[Record]) -> None:
        fresh = [r for r in records if isinstance(r, EpochRecord) and r.epoch not in self.logged]
        if fresh:
            self.run.log_epochs(fresh)  # type: ignore[attr-defined]
            self.logged.update(r.epoch for r in fresh)
