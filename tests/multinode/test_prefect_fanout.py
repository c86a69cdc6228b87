"""Prefect fans a training out over two hosts: a real Prefect server on host A's address (both namespaces reach
it), the deployments of prefect-cluster.yaml, a worker per host on that host's work queue (host A's also takes the
parent flow's `control` queue), then `train-multinode`: 2 nodes x 2 ranks train like one process, with one MLflow parent
run and a child run per rank; a node job that fails fails the parent promptly with that rank's traceback and the
other node job is stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

from tests.multinode.hosts import Host
from tests.pipeline.conftest import PROJECT, quickstart

pytestmark = [pytest.mark.multinode, pytest.mark.slow, pytest.mark.deployment, pytest.mark.timeout(900)]
TRAINING = {"model": "gcn", "hidden": 16, "dropout": 0.5, "seed": 3, "collective_timeout_s": 60}

# the API over plain HTTP, from inside a host's namespace: no Prefect import in a loop that polls every 3 s
STATE = """
import json, os, sys, urllib.request as u
api = os.environ["PREFECT_API_URL"]
def get(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = u.Request(api + path, data, {"Content-Type": "application/json"})
    with u.urlopen(req, timeout=30) as r:
        return json.loads(r.read())
runs = [get("/flow_runs/" + i) for i in sys.argv[1:]] if sys.argv[1:] else get("/flow_runs/filter", {})
print(json.dumps([[r["state"]["type"], r["state"].get("message") or ""] for r in runs]))
"""


def _env(tmp: Path, api: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        {
            "PREFECT_HOME": str(tmp / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
            "NTP_DATA_DIR": str(tmp / "data"),
            "OMP_NUM_THREADS": "1",
            "PREFECT_WORKER_QUERY_SECONDS": "2",  # workers look for runs every 2 s (10 by default): a test waits less
        }
    )
    if api:
        env["PREFECT_API_URL"] = api
    return env


@contextmanager
def _started(host: Host, argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            host.command(argv),
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


def _in(host: Host, argv: list[str], env: dict[str, str], timeout: float = 180) -> str:
    out = subprocess.run(
        host.command(argv),
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert out.returncode == 0, f"{' '.join(argv)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout + out.stderr


def _prefect(host: Host, args: list[str], env: dict[str, str], timeout: float = 180) -> str:
    return _in(host, [sys.executable, "-m", "prefect", *args], env, timeout)


def _states(host: Host, env: dict[str, str], *ids: str) -> list[list[str]]:
    return json.loads(_in(host, [sys.executable, "-c", STATE, *ids], env).strip().splitlines()[-1])


def _wait_final(host: Host, env: dict[str, str], flow_run_id: str, timeout: float) -> tuple[str, str, float]:
    """(state type, message, seconds waited) of a flow run once it is final."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        [(kind, message)] = _states(host, env, flow_run_id)
        if kind in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return kind, message, time.monotonic() - t0
        time.sleep(3)
    raise AssertionError(f"flow run {flow_run_id} not final after {timeout} s")


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """Server on A, pool gpu-cluster with queues control, host-a and host-b (limit 1), the deployments, and the
    workers: A's on host-a and control, B's on host-b. Yields (environment with the API URL, a shared folder)."""
    a, b = hosts
    tmp = tmp_path_factory.mktemp("fanout")
    api = f"http://{a.address}:4200/api"
    env = _env(tmp, api)
    with ExitStack() as stack:
        server = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            a.address,
            "--port",
            "4200",
            "--no-ui",
            "--analytics-off",
        ]
        stack.enter_context(_started(a, server, _env(tmp, None), tmp / "server.log"))
        check = f"import urllib.request as u; u.urlopen({api + '/health'!r}, timeout=2)"
        deadline = time.monotonic() + 120
        while subprocess.run(b.command([sys.executable, "-c", check]), capture_output=True, timeout=60).returncode:
            assert time.monotonic() < deadline, (tmp / "server.log").read_text()[-3000:]
            time.sleep(1)
        _prefect(a, ["work-pool", "create", "gpu-cluster", "--type", "process"], env)
        _prefect(a, ["work-queue", "create", "control", "--pool", "gpu-cluster"], env)
        for queue in ("host-a", "host-b"):
            _prefect(a, ["work-queue", "create", queue, "--pool", "gpu-cluster", "--limit", "1"], env)
        _prefect(a, ["--no-prompt", "deploy", "--all", "--prefect-file", "prefect-cluster.yaml"], env)
        worker = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gpu-cluster"]
        stack.enter_context(
            _started(a, [*worker, "--work-queue", "host-a", "--work-queue", "control"], env, tmp / "worker-a.log")
        )
        stack.enter_context(_started(b, [*worker, "--work-queue", "host-b"], env, tmp / "worker-b.log"))
        yield env, tmp


def _run(host: Host, env: dict[str, str], params: dict) -> str:
    out = _prefect(host, ["deployment", "run", "train-multinode/train-multinode", "--params", json.dumps(params)], env)
    return next(line.split()[-1] for line in out.splitlines() if "UUID" in line)


def test_prefect_fans_a_training_out_over_two_hosts(hosts, cluster, cora_store: str, tmp_path: Path) -> None:
    a, _b = hosts
    env, _shared = cluster
    single = tmp_path / "single.jsonl"
    argv = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        cora_store,
        "--epochs",
        "3",
        "--nproc",
        "1",
        "--device",
        "cpu",
        "--no-track",
        "--results",
        str(single),
    ]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TRAINING.items()]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)

    params = {
        "store": cora_store,
        "hosts": ["host-a", "host-b"],
        "rdzv_endpoint": f"{a.address}:29631",
        "training": {**TRAINING, "epochs": 3},
        "launch": {"nproc": 2, "device": "cpu", "job_timeout_s": 300},
        "experiment": "fanout",
    }
    kind, message, _ = _wait_final(a, env, _run(a, env, params), timeout=600)
    assert kind == "COMPLETED", message

    from mlflow.tracking import MlflowClient

    from ntp.run import tracking

    c = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = c.get_experiment_by_name("fanout")
    [parent] = c.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")
    assert parent.info.status == "FINISHED" and parent.data.params["world_size"] == "4"
    children = c.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_KIND}` = 'worker'")
    assert sorted(r.data.tags["ntp.rank"] for r in children) == ["0", "1", "2", "3"]
    results = Path(parent.data.tags["ntp.results"])
    losses = [r["loss"] for r in map(json.loads, results.read_text().splitlines()) if "epoch" in r]
    expected = [r["loss"] for r in map(json.loads, single.read_text().splitlines()) if "epoch" in r]
    np.testing.assert_allclose(losses, expected, rtol=1e-4)


def test_a_failing_node_job_fails_the_parent_promptly(hosts, cluster, cora_store: str) -> None:
    a, _b = hosts
    env, _shared = cluster
    params = {
        "store": cora_store,
        "hosts": ["host-a", "host-b"],
        "rdzv_endpoint": f"{a.address}:29632",
        "training": {**TRAINING, "epochs": 100_000, "fail_at_epoch": 3, "fail_rank": 2},
        "launch": {"nproc": 2, "device": "cpu", "job_timeout_s": 600},
        "experiment": "fanout-failing",
    }
    t0 = time.monotonic()
    kind, message, _ = _wait_final(a, env, _run(a, env, params), timeout=600)
    assert kind == "FAILED", message
    assert "node 1 (work queue host-b" in message and "ntp rank failed (rank 2)" in message, message
    assert "injected failure on rank 2 at epoch 3" in message, "the failing rank's traceback"
    assert time.monotonic() - t0 < 300, "promptly: far below the job's own time limit"
    deadline = time.monotonic() + 60
    while any(kind in ("RUNNING", "PENDING", "CANCELLING") for kind, _ in _states(a, env)):
        assert time.monotonic() < deadline, _states(a, env)
        time.sleep(2)
