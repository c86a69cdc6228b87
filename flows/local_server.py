"""A Prefect API for `ntp pipeline` when none is configured: a temporary server this process owns.

Prefect's own ephemeral server shares the terminal's process group, so a Ctrl-C killed it under the running flow
(which then retried against a dead API for minutes), and a SIGTERM left it running. This one runs in a session of
its own, dies with this process (ntp.run.processes) and is stopped when the block ends, whatever ends it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from ntp.run.processes import spawn_group, stop_group

STARTUP_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def prefect_api(on_line=print) -> Iterator[str]:
    """The configured API (``PREFECT_API_URL``, from the environment or the Prefect profile); else a temporary
    server on 127.0.0.1 for the block (its URL is yielded and used by every Prefect call inside)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    configured = PREFECT_API_URL.value()
    if configured:
        yield configured
        return

    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = spawn_group(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _healthy(api):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the temporary Prefect server did not start ({' '.join(cmd)}); set "
                    "PREFECT_API_URL to a running server instead"
                )
            time.sleep(0.2)
        on_line(f"temporary Prefect server on {api} (set PREFECT_API_URL to use your own)")
        with temporary_settings(updates={PREFECT_API_URL: api}), _everywhere():
            try:
                yield api
            finally:
                _drain()
    finally:
        stop_group(server)


@contextmanager
def _everywhere() -> Iterator[None]:
    """The current settings as Prefect's process-global ones too: code running in a context copied earlier (its
    event-loop threads, its crash handling) must not start a server of its own. Prefect's test harness does the
    same, through this internal helper (pinned Prefect; tests/pipeline/test_process_faults.py notices a change)."""
    from prefect.context import _temporary_global_settings_context, get_settings_context

    with _temporary_global_settings_context(get_settings_context()):
        yield


def _drain() -> None:
    """Send the logs and events still queued while the server is up: at interpreter exit Prefect would otherwise
    retry them against a stopped server for minutes (Prefect's own test harness drains the same way)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for drain in (
        lambda: APILogWorker.drain_all(timeout=10, at_exit=False),
        lambda: EventsWorker.drain_all(timeout=10, at_exit=False),
    ):
        try:
            drain()
        except RuntimeError:  # a worker that never started
            pass
