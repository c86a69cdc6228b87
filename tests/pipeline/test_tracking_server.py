"""A real MLflow tracking server that is down, or lost while a job trains: ``ntp train`` (as a user runs it, a
torchrun job on Cora) is refused in seconds with the ways out, or trains on to a complete results file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ntp.run.tracking.mlflow_store import server_problem
from tests.ntp.spawn import free_port
from tests.processes import wait_for

pytestmark = pytest.mark.slow


@contextmanager
def mlflow_server(folder: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``mlflow server`` on a free local port with a sqlite store in ``folder``, in its own process group (it starts
    uvicorn and a job runner): its URI and process, stopped at the end whatever happened."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'server.db'}", "--workers", "1"]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    with open(folder / "server.log", "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or server_problem(uri, 1.0) is None, 180, "mlflow server")
        assert proc.poll() is None, (folder / "server.log").read_text()[-3000:]
        yield uri, proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """The server's whole process group, SIGTERM then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _train(store: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "ntp.run.cli", "train", "--store", store, "--nproc", "2", *args]


def test_a_server_down_is_refused_in_seconds_and_one_lost_mid_run_leaves_the_job_training(
    cora_store: str, tmp_path: Path
) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    started = time.monotonic()
    down = subprocess.run(
        _train(cora_store, "--epochs", "2", "--results", str(tmp_path / "down.jsonl")),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert down.returncode == 2, down.stdout + down.stderr
    assert took < 30, f"refused after {took:.0f} s"  # the server check waits 5 s at most; the rest is Python's start
    for needed in (env["MLFLOW_TRACKING_URI"], "does not answer", "start it", "--no-track", "set MLFLOW_TRACKING_URI"):
        assert needed in down.stderr, down.stderr
    assert "Traceback" not in down.stderr + down.stdout
    assert not (tmp_path / "down.jsonl").exists()  # nothing trained

    results = tmp_path / "results.jsonl"
    with mlflow_server(tmp_path) as (uri, server):
        env["MLFLOW_TRACKING_URI"] = uri
        job = subprocess.Popen(
            _train(cora_store, "--epochs", "80", "--eval-every", "1", "--results", str(results)),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for(lambda: results.is_file() and results.read_text().count("\n") >= 2, 180, "two epochs")
            stop(server)  # the server is lost mid-run
            out, _ = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert job.returncode == 0, out
    assert out.count("warning: the MLflow tracking server at") == 1, out
    assert f"{uri} stopped answering" in out and "trains on untracked" in out
    assert "Traceback" not in out and "WARNING mlflow" not in out, out
    assert [r["epoch"] for r in records if "epoch" in r] == list(range(80))
    assert "best_epoch" in records[-1]  # the final record
    assert "(incomplete: its tracking server stopped answering during the job)" in out

    from mlflow.tracking import MlflowClient

    # the run was tracked until the server went: its params and first epochs are in the server's store
    stored = MlflowClient(f"sqlite:///{tmp_path / 'server.db'}")
    runs = stored.search_runs([e.experiment_id for e in stored.search_experiments()], "tags.`ntp.kind` = 'train'")
    assert len(runs) == 1 and runs[0].data.params["epochs"] == "80"  # (its ranks' child runs, if logged yet, aside)
    # it could not be ended there; the next run's sweep on this host ends it as the job ended, not KILLED
    assert runs[0].info.status == "RUNNING"
    from ntp.run.tracking.orphans import TAG_ENDED_LATE, close_orphaned_runs

    assert close_orphaned_runs(stored, runs[0].info.experiment_id) == [runs[0].info.run_id]
    ended = stored.get_run(runs[0].info.run_id)
    assert ended.info.status == "FINISHED" and "stopped answering" in ended.data.tags[TAG_ENDED_LATE]
    assert ended.info.end_time >= runs[0].info.start_time
