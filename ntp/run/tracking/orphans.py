"""No run left RUNNING: how a run ends, and closing the runs whose launcher was killed outright.

A launcher killed with SIGKILL (or by the OOM killer) cannot end its MLflow run. Every parent run records the host
and process of its launcher; the next run started in the same experiment on that host closes the runs whose
launcher is gone (KILLED, with the reason as a tag). A launcher whose tracking server stopped answering cannot end
its run either; it leaves how the job ended in the data directory (:func:`record_unended`), and the next run ends
the run with that status and time instead.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ntp.errors import Terminated
from ntp.run.tracking.mlflow_store import TAG_ERROR, data_dir

TAG_HOST, TAG_PID, TAG_STARTED = "ntp.launcher_host", "ntp.launcher_pid", "ntp.launcher_started"
TAG_ENDED_LATE = "ntp.ended_late"


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
    """End the RUNNING runs of ``experiment_id`` launched on this host by a process that no longer exists: as their
    job ended where the launcher recorded it (:func:`record_unended`), KILLED otherwise."""
    host = socket.gethostname()
    runs = client.search_runs(
        [experiment_id], f"attributes.status = 'RUNNING' and tags.`{TAG_HOST}` = '{host}'", max_results=200
    )
    closed = []
    for run in runs:
        if _launcher_alive(run.data.tags):
            continue
        rid, ended = run.info.run_id, _unended(run.info.run_id)
        if ended is not None:
            client.set_tag(
                rid,
                TAG_ENDED_LATE,
                f"the tracking server stopped answering during the job; it ended "
                f"{ended['status']} at {ended['end_time']} ms, ended here by the next run on {host}",
            )
            client.set_terminated(rid, ended["status"], end_time=ended["end_time"])
            _unended_file(rid).unlink(missing_ok=True)
        else:
            client.set_tag(
                rid,
                TAG_ERROR,
                f"the launcher (pid {run.data.tags[TAG_PID]} on {host}) died "
                "without ending the run (killed with SIGKILL?)",
            )
            client.set_terminated(rid, "KILLED")
        closed.append(rid)
    return closed


def record_unended(run_id: str, status: str) -> None:
    """How the job of ``run_id`` ended, for the next run on this host to end it with (its server was lost)."""
    path = _unended_file(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status, "end_time": int(time.time() * 1000)}))


def _unended_file(run_id: str) -> Path:
    return data_dir() / "tracking" / "unended" / f"{run_id}.json"


def _unended(run_id: str) -> dict | None:
    try:
        return json.loads(_unended_file(run_id).read_text())
    except (OSError, ValueError):
        return None
