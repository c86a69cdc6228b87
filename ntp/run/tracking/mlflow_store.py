"""Where MLflow lives and how runs are named, tagged and linked.

The tracking URI is ``$MLFLOW_TRACKING_URI`` when set (a real server), else a sqlite database in the data
directory, with artifacts beside it.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

#: Tag keys (the mlflow.* ones are MLflow's own).
TAG_KIND = "ntp.kind"  # "train" (parent), "worker" (child), "evaluate"
TAG_FLOW_RUN = "prefect.flow_run_id"
TAG_GIT = "git_commit"
TAG_PARENT = "mlflow.parentRunId"
TAG_ERROR = "ntp.error"


def data_dir() -> Path:
    from storage import default_data_dir

    return Path(default_data_dir())


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<data dir>/mlflow.db`` (the directory is created)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    data = data_dir().resolve()
    data.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data / 'mlflow.db'}"


#: sqlite URIs whose schema this process has seen created and migrated
_READY: set[str] = set()


def client(uri: str | None = None) -> Any:
    """An ``MlflowClient`` for ``uri`` (default: :func:`tracking_uri`), its sqlite schema ready."""
    from mlflow.tracking import MlflowClient

    uri = uri or tracking_uri()
    if not uri.startswith("sqlite:///") or uri in _READY:
        return MlflowClient(uri)
    # MLflow creates and migrates a sqlite schema when a process first opens it; several processes doing it at once
    # leave the database broken. One process at a time does it, under a lock file beside the database.
    from storage.lock import file_lock

    db = Path(uri[len("sqlite:///"):])
    with file_lock(db.with_name(db.name + ".lock")):
        c = MlflowClient(uri)
        c.search_experiments(max_results=1)
    _READY.add(uri)
    return c


def experiment_id(name: str, mlflow_client: Any = None) -> str:
    """Id of experiment ``name``, created when missing (safe when two jobs create it at once)."""
    from mlflow.exceptions import MlflowException

    c = mlflow_client or client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=_artifact_location(c.tracking_uri, name))
    except MlflowException:
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _artifact_location(uri: str, name: str) -> str | None:
    """Next to a sqlite database: ``<db dir>/mlartifacts/<name>`` (MLflow's default is ./mlruns in the current
    directory, wherever that is). A server decides for itself (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"  # never "..": stay inside
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / safe).resolve().as_uri()


def run_url(run_id: str, uri: str | None = None) -> str:
    """A link to the run: the server page for http(s) URIs, else an ``mlflow ui`` hint."""
    uri = uri or tracking_uri()
    exp = client(uri).get_run(run_id).info.experiment_id
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}"
    return f"mlflow ui --backend-store-uri {uri}  ->  http://127.0.0.1:5000/#/experiments/{exp}/runs/{run_id}"


def git_commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the git checkout holding this package (or ``cwd``), or None."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
