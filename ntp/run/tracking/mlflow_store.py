"""Where MLflow lives and how runs are named, tagged and linked.

The tracking URI is ``$MLFLOW_TRACKING_URI`` when set (a real server), else a sqlite database in the data
directory, with artifacts beside it. A server is checked before a job starts (:func:`check_server`), and MLflow's
HTTP client gives up on one in seconds, not minutes (:data:`HTTP_DEFAULTS`). Links point at ``$NTP_MLFLOW_UI_URL`` (default: the server itself, or
http://127.0.0.1:5000 where ``mlflow ui`` serves a sqlite database).
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
#: The experiment tag the MLflow UI reads for an experiment's kind; ours train models (not GenAI apps).
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: MLflow 3.17's UI picks its view (GenAI or machine learning) from this URL parameter, else from the browser's
#: last choice (GenAI at first), not from the tag: our links carry it.
UI_VIEW = "workflowType=machine_learning"
UI_URL_ENV = "NTP_MLFLOW_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:5000"


#: MLflow's HTTP client settings unless the environment sets them: its own (7 retries, backoff factor 2, 120 s
#: timeouts) kept a job silent for 253 s on a server that refused connections before it failed
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
#: seconds a tracking server has to answer its health check
SERVER_CHECK_S = 5.0


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def server_problem(uri: str, timeout_s: float = SERVER_CHECK_S) -> str | None:
    """Why the tracking server at ``uri`` does not answer its health check within ``timeout_s``, or None when it
    does (and for a URI that is no server)."""
    import urllib.request

    if not is_server(uri):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
            return None if reply.status == 200 else f"its health check answered HTTP {reply.status}"
    except OSError as exc:  # URLError, connection refused, timeout
        return str(getattr(exc, "reason", None) or exc)


def check_server(uri: str | None = None) -> None:
    """Raise TrackingUnavailable, naming the URI and the ways out, when the tracking server does not answer."""
    from ntp.errors import TrackingUnavailable

    uri = uri or tracking_uri()
    problem = server_problem(uri)
    if problem is not None:
        raise TrackingUnavailable(
            f"the MLflow tracking server at {uri} (MLFLOW_TRACKING_URI) does not answer ({problem}): start it "
            f"(mlflow server --host HOST --port PORT), train without tracking (--no-track), or set "
            f"MLFLOW_TRACKING_URI to another server (unset, runs go to a sqlite database in the data directory)"
        )


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
    if is_server(uri):
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
    if not uri.startswith("sqlite:///") or uri in _READY:
        return MlflowClient(uri)
    # MLflow creates and migrates a sqlite schema when a process first opens it; several processes doing it at once
    # leave the database broken. One process at a time does it, under a lock file beside the database.
    from storage.lock import file_lock

    db = Path(uri[len("sqlite:///") :])
    with file_lock(db.with_name(db.name + ".lock")):
        c = MlflowClient(uri)
        c.search_experiments(max_results=1)
    _READY.add(uri)
    return c


def experiment_id(name: str, mlflow_client: Any = None) -> str:
    """Id of experiment ``name``, created when missing (safe when two jobs create it at once) and marked as a
    model-training experiment (an older one without a kind is marked too)."""
    from mlflow.exceptions import MlflowException

    c = mlflow_client or client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if TAG_EXPERIMENT_KIND not in exp.tags:
            _mark_kind(c, exp.experiment_id)
        return exp.experiment_id
    try:
        return c.create_experiment(
            name,
            artifact_location=_artifact_location(c.tracking_uri, name),
            tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND},
        )
    except MlflowException:
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _mark_kind(c: Any, exp_id: str) -> None:
    """Best effort: a shared server may refuse experiment tags to a user who may still log runs."""
    from mlflow.exceptions import MlflowException

    try:
        c.set_experiment_tag(exp_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
    except MlflowException:
        pass


def _artifact_location(uri: str, name: str) -> str | None:
    """Next to a sqlite database: ``<db dir>/mlartifacts/<name>`` (MLflow's default is ./mlruns in the current
    directory, wherever that is). A server decides for itself (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"  # never "..": stay inside
    return (Path(uri[len("sqlite:///") :]).parent / "mlartifacts" / safe).resolve().as_uri()


def ui_url(uri: str | None = None) -> str:
    """Where the MLflow UI is: ``$NTP_MLFLOW_UI_URL``, else the tracking server (http URIs), else
    http://127.0.0.1:5000 (``mlflow ui``'s default)."""
    uri = uri or tracking_uri()
    default = uri if uri.startswith(("http://", "https://")) else DEFAULT_UI_URL
    return (os.environ.get(UI_URL_ENV) or default).rstrip("/")


def run_url(run_id: str, uri: str | None = None) -> str:
    """A link to the run in the UI's machine-learning view: the page itself for a server, else the ``mlflow ui``
    command that serves the database and the page it will show."""
    uri = uri or tracking_uri()
    exp = client(uri).get_run(run_id).info.experiment_id
    page = f"{ui_url(uri)}/#/experiments/{exp}/runs/{run_id}?{UI_VIEW}"
    if uri.startswith(("http://", "https://")):
        return page
    return f"{_ui_command(uri)}  ->  {page}  (UI address: ${UI_URL_ENV}, default {DEFAULT_UI_URL})"


def _ui_command(uri: str) -> str:
    """``mlflow ui`` serving ``uri`` where :func:`ui_url` says (its host and port, when the address has a port)."""
    from urllib.parse import urlsplit

    where = urlsplit(ui_url(uri))
    command = f"mlflow ui --backend-store-uri {uri}"
    if where.port is not None:
        command += f" --host {where.hostname} --port {where.port}"
    return command


def git_commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the git checkout holding this package (or ``cwd``), or None."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
