"""A tracking server lost while a job trains: training goes on, the loss is said once, later MLflow calls are skipped.

The MLflow client of a training run is wrapped (:class:`GuardedClient`): a call that fails while the server no
longer answers its health check marks tracking lost; one that fails while it answers is raised as before (a bug, a
refused request). The results file is the ranks' own (rank 0 writes it), so it ends complete whatever MLflow does.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from ntp.run.tracking.mlflow_store import server_problem


class TrackingGuard:
    """Whether tracking to ``uri`` is lost; ``warn`` says so once, then each of ``on_lost`` runs."""

    def __init__(self, uri: str, warn: Callable[[str], None], note: str = "") -> None:
        self.uri, self.warn, self.note = uri, warn, note
        self.on_lost: list[Callable[[], None]] = []
        self.lost = False
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; None, without calling it, once tracking is lost."""
        if self.lost:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            problem = server_problem(self.uri)
            if problem is None:
                raise
            self.lose(f"{problem}; {type(exc).__name__}")
            return None

    def lose(self, why: str) -> None:
        """Mark tracking lost (``why``: what failed); only the first call says so."""
        with self._lock:
            if self.lost:
                return
            self.lost = True
        self.warn(
            f"warning: the MLflow tracking server at {self.uri} stopped answering ({why}); the job trains on "
            f"untracked{self.note}"
        )
        for stop in self.on_lost:
            stop()


#: MLflow's system metrics thread, which polls the run on its own client every few seconds
MONITOR_LOGGER = "mlflow.system_metrics.system_metrics_monitor"


class QuietMonitor(logging.Filter):
    """Drops the system metrics thread's warnings where the server no longer answers: the guard says that once
    (the thread often finds out first, with a traceback-sized line of its own)."""

    def __init__(self, guard: TrackingGuard) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        problem = server_problem(self.guard.uri)
        if problem is None:
            return True
        self.guard.lose(f"{problem}; system metrics")
        return False


class GuardedClient:
    """An MlflowClient whose every method call goes through ``guard`` (:meth:`TrackingGuard.call`)."""

    def __init__(self, client: Any, guard: TrackingGuard) -> None:
        self._client, self.guard = client, guard

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        return functools.partial(self.guard.call, attr) if callable(attr) else attr
