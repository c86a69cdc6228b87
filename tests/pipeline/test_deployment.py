"""The real deployment loop, offline: server, process pool, `prefect deploy`, worker --run-once, deployment run.

Every process started here runs in its own session (process group) and is stopped, with its descendants,
in a finally block.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.ntp.spawn import free_port
from tests.pipeline.conftest import CORA, PROJECT, quickstart

pytestmark = [pytest.mark.deployment, pytest.mark.slow, pytest.mark.timeout(420)]

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@contextmanager
def _started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=PROJECT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            quickstart().stop_group(proc)


def _prefect(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert out.returncode == 0, f"prefect {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _wait_healthy(api: str, server: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"prefect server exited:\n{log.read_text()[-3000:]}"
        try:
            if _get(f"{api}/health") is True:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"prefect server not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


class Deployed(NamedTuple):
    api: str  #: the server's API URL
    mlflow_uri: str
    env: dict[str, str]  #: for the CLI, workers and flows


@contextmanager
def deployed_project(tmp_path: Path, **extra_env: str) -> Iterator[Deployed]:
    """A Prefect server of the test's own (its home, API and MLflow store under ``tmp_path``; this environment's
    Prefect settings left out) with the project's pools and `prefect deploy --all`; stopped at the end."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "prefect"),
            "PREFECT_API_URL": api,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "MLFLOW_TRACKING_URI": mlflow_uri,
            "NTP_DATA_DIR": str(tmp_path / "data"),
            **extra_env,
        }
    )
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    server_cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with _started([*server_cmd, "--no-ui", "--analytics-off"], server_env, tmp_path / "server.log") as server:
        _wait_healthy(api, server, tmp_path / "server.log")
        _prefect(["work-pool", "create", "gpu-pool", "--type", "process"], env)
        _prefect(["work-pool", "set-concurrency-limit", "gpu-pool", "1"], env)
        _prefect(["work-pool", "create", "control-pool", "--type", "process"], env)
        _prefect(["--no-prompt", "deploy", "--all"], env, timeout=180)
        yield Deployed(api, mlflow_uri, env)


def test_deployment_loop(tmp_path: Path) -> None:
    if not CORA.is_dir():
        pytest.skip(f"{CORA} is missing")
    params = {
        "params": {
            "dataset": {"name": "cora", "from_dir": str(CORA)},
            "training": {"epochs": 2, "hidden": 16, "eval_every": 1},
            "launch": {"nproc": 2, "device": "cpu", "job_timeout_s": 120},
            "experiment": "deployment-test",
        }
    }
    with deployed_project(tmp_path) as (api, mlflow_uri, env):
        out = _prefect(["deployment", "run", "pipeline/pipeline", "--params", json.dumps(params)], env)
        flow_run_id = UUID.findall(out)[-1]
        worker_cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gpu-pool", "--run-once"]
        with _started(worker_cmd, env, tmp_path / "worker.log") as worker:
            try:
                worker.wait(timeout=300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"worker did not finish:\n{(tmp_path / 'worker.log').read_text()[-4000:]}")
        run = _get(f"{api}/flow_runs/{flow_run_id}")
        worker_log = (tmp_path / "worker.log").read_text()
        assert run["state_type"] == "COMPLETED", f"flow run {run['state_type']}:\n{worker_log[-6000:]}"
        deployment = _get(f"{api}/deployments/{run['deployment_id']}")
        assert deployment["work_pool_name"] == "gpu-pool"
        assert _get(f"{api}/work_pools/gpu-pool")["concurrency_limit"] == 1
        assert (deployment.get("global_concurrency_limit") or {}).get("limit") == 1, deployment
        nightly = _get(f"{api}/deployments/name/pipeline/nightly-arxiv")
        assert nightly["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
        assert _get(f"{api}/deployments/name/train/train")["work_pool_name"] == "gpu-pool"
        assert (
            Path(deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"]) == PROJECT
        )

    from mlflow.tracking import MlflowClient

    c = MlflowClient(mlflow_uri)
    exp = c.get_experiment_by_name("deployment-test")
    runs = c.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert "eval/test" in runs[0].data.metrics
