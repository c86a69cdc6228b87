"""No run left RUNNING: how a run ends, and closing the runs whose launcher was killed outright.

A launcher killed with SIGKILL (or by the OOM killer) cannot end its MLflow run. Every parent run records the host
and process of its launcher; the next run started in the same experiment on that host closes the runs whose
launcher is gone (KILLED, with the reason as a tag).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from ntp.errors import Terminated
from ntp.run.tracking.mlflow_store import TAG_ERROR

TAG_HOST, TAG_PID, TAG_STARTED = "ntp.launcher_host", "ntp.launcher_pid", "ntp.launcher_started"


def end_status(exc: BaseException) -> str:
    """KILLED for an interruption (Ctrl-C, SIGTERM), FAILED for an error."""
    return "KILLED" if isinstance(exc, (KeyboardInterrupt, Terminated)) else "FAILED"


def launcher_tags() -> dict[str, str]:
    """Who launched the run: host, pid and the process's start time (a pid can be reused later)."""
    return {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid()), TAG_STARTED: str(_started(os.getpid()))}


def _started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _launcher_alive(tags: dict[str, str]) -> bool:
    try:
        pid = int(tags[TAG_PID])
    except (KeyError, ValueError):
        return True  # not ours to judge
    return str(_started(pid)) == tags.get(TAG_STARTED)


def close_orphaned_runs(client: Any, experiment_id: str) -> list[str]:
    """End KILLED the RUNNING runs of ``experiment_id`` launched on this host by a process that no longer exists."""
    host = socket.gethostname()
    runs = client.search_runs(
        [experiment_id], f"attributes.status = 'RUNNING' and tags.`{TAG_HOST}` = '{host}'", max_results=200
    )
    closed = []
    for run in runs:
        if not _launcher_alive(run.data.tags):
            client.set_tag(
                run.info.run_id,
                TAG_ERROR,
                f"the launcher (pid {run.data.tags[TAG_PID]} on {host}) died "
                "without ending the run (killed with SIGKILL?)",
            )
            client.set_terminated(run.info.run_id, "KILLED")
            closed.append(run.info.run_id)
    return closed
