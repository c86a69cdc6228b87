"""One training job across two hosts (network namespaces joined by a veth pair), 2 nodes x 2 ranks on gloo: the
same losses as one process, whether the node ranks are given or left to the rendezvous; a node that dies ends the
other promptly with a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.multinode.hosts import Host
from tests.processes import processes_with

pytestmark = pytest.mark.multinode
EPOCHS = 4
TRAIN = [
    "--model",
    "gcn",
    "--hidden",
    "16",
    "--dropout",
    "0.5",
    "--seed",
    "3",
    "--device",
    "cpu",
    "--no-track",
    "--collective-timeout-s",
    "60",
]


def _train(host: Host | None, store: str, results: Path, extra: list[str]) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        store,
        "--epochs",
        str(EPOCHS),
        "--results",
        str(results),
        *TRAIN,
        *extra,
    ]
    return subprocess.Popen(
        host.command(argv) if host else argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _losses(results: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, results.read_text().splitlines()) if "epoch" in r]


def _two_node_job(hosts, store: str, results: Path, port: int, give_ranks: bool) -> list[str]:
    a, _b = hosts
    procs = [
        _train(
            host,
            store,
            results,
            [
                "--nnodes",
                "2",
                "--nproc",
                "2",
                "--rdzv-endpoint",
                f"{a.address}:{port}",
                *(["--node-rank", str(rank)] if give_ranks else []),
                "--job-timeout",
                "240",
            ],
        )
        for rank, host in enumerate(hosts)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return outputs


@pytest.mark.parametrize("give_ranks", [True, False], ids=["node-rank-given", "node-rank-from-rendezvous"])
def test_two_hosts_train_like_one_process(hosts, cora_store: str, tmp_path: Path, give_ranks: bool) -> None:
    single = _train(None, cora_store, tmp_path / "single.jsonl", ["--nproc", "1"])
    assert single.wait(timeout=300) == 0, single.stdout.read()[-3000:]
    results = tmp_path / "two-hosts.jsonl"
    _two_node_job(hosts, cora_store, results, 29611 if give_ranks else 29612, give_ranks)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records[0]["workers"]) == 4 and records[-1]["world_size"] == 4
    np.testing.assert_allclose(_losses(results), _losses(tmp_path / "single.jsonl"), rtol=1e-4)


def test_a_dead_node_ends_the_other_within_60_s(hosts, cora_store: str, tmp_path: Path) -> None:
    a, b = hosts
    results = tmp_path / "r.jsonl"
    common = ["--nnodes", "2", "--nproc", "2", "--rdzv-endpoint", f"{a.address}:29613", "--job-timeout", "600"]
    node0 = _train(a, cora_store, results, [*common, "--node-rank", "0", "--epochs", "100000"])
    node1 = _train(b, cora_store, results, [*common, "--node-rank", "1", "--epochs", "100000"])
    deadline = time.monotonic() + 240
    while not (results.is_file() and results.stat().st_size) and time.monotonic() < deadline:
        assert node0.poll() is None and node1.poll() is None, "both nodes train"
        time.sleep(0.5)
    node1.kill()  # the whole node: its launcher, and with it (parent-death signal) torchrun and the workers
    node1.wait()
    t0 = time.monotonic()
    out = node0.communicate(timeout=90)[0]
    assert node0.returncode == 1 and time.monotonic() - t0 < 60, out[-3000:]
    assert "error: training job failed" in out
    deadline = time.monotonic() + 30
    while processes_with(str(results)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_with(str(results)), "no process of either node is left"


def test_the_leading_node_tracks_one_run_for_the_whole_job(hosts, cora_store: str, tmp_path: Path) -> None:
    """Both nodes run the same tracked command; node 0 keeps one MLflow parent run with a worker run per rank, and
    the results land in the job's folder that every node names alike."""
    from ntp.run import tracking

    a, _b = hosts
    argv = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        cora_store,
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--nnodes",
        "2",
        "--nproc",
        "2",
        "--rdzv-endpoint",
        f"{a.address}:29614",
        "--experiment",
        "two-hosts",
        "--job-timeout",
        "240",
    ]
    procs = [
        subprocess.Popen(
            host.command([*argv, "--node-rank", str(rank)]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for rank, host in enumerate(hosts)
    ]
    for p in procs:
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out[-3000:]
    c = tracking.client()
    exp = c.get_experiment_by_name("two-hosts")
    parents = c.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["world_size"] == "4" and parents[0].data.tags["ntp.nnodes"] == "2"
    children = c.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_KIND}` = 'worker'")
    assert sorted(r.data.tags["ntp.rank"] for r in children) == ["0", "1", "2", "3"]
    assert Path(parents[0].data.tags["ntp.results"]).parent.name.startswith("gcn-"), "the job's folder, not the run's"
