"""The launch spec: defaults decided once, contradictions refused with their fix, and the two bugs it fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ntp.config import TrainConfig
from ntp.errors import ConfigError, MemoryPlanError, WorkerFailed, is_input_error
from ntp.run.cli import main as ntp_main
from ntp.run.launch import launch_training
from ntp.spec import resolve
from storage import StoreError


def test_defaults_follow_the_machine_and_the_process_count() -> None:
    cpu = resolve(TrainConfig(store="s"), gpus=0)
    assert (cpu.nproc_per_node, cpu.mode, cpu.device, cpu.backend) == (min(2, os.cpu_count() or 1), "tp", "cpu", "gloo")
    gpus = resolve(TrainConfig(store="s"), gpus=4)
    assert (gpus.nproc_per_node, gpus.mode, gpus.device, gpus.backend) == (4, "tp", "cuda", "nccl")
    one = resolve(TrainConfig(store="s"), nproc=1, gpus=0)
    assert (one.mode, one.backend) == ("single", None)
    assert resolve(TrainConfig(store="s", mode="single"), gpus=4).nproc_per_node == 1
    data = resolve(TrainConfig(store="s", mode="data"), nproc=3, gpus=0)
    assert (data.mode, data.world_size, data.config.mode) == ("data", 3, "data")
    two_nodes = resolve(TrainConfig(store="s"), nproc=2, nnodes=2, rdzv_endpoint="h:1", gpus=0)
    assert (two_nodes.world_size, two_nodes.mode) == (4, "tp")


@pytest.mark.parametrize(
    "config, launch, message",
    [
        (dict(mode="single"), dict(nproc=2), "--mode single runs one process"),
        (dict(), dict(nproc=2, device="cuda", gpus=1), "NCCL cannot run two ranks on one GPU"),
        (dict(), dict(device="cuda", gpus=0), "no CUDA GPU is visible"),
        (dict(), dict(nproc=0), "--nproc 0 must be at least 1"),
        (dict(), dict(nnodes=0), "--nnodes 0 must be at least 1"),
        (dict(), dict(nnodes=2), "needs --rdzv-endpoint"),
        (dict(), dict(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "--node-rank 2 must be in [0, --nnodes 2)"),
        (dict(), dict(job_timeout_s=0), "--job-timeout 0 must be positive"),
        (dict(), dict(nnodes=2, rdzv_endpoint="0.0.0.0:29500"), "names every interface"),
        (dict(), dict(nnodes=2, rdzv_endpoint="[::]:29500"), "give the address of the interface"),
    ],
)
def test_contradictory_launches_are_refused_with_the_fix(config: dict, launch: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(TrainConfig(store="s", **config), **{"gpus": 0, **launch})
    assert message in str(err.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(residual=True, jk="cat"), "--residual, --jk cat shape(s) the coupled GNN layers"),
        (dict(arch="coupled", jk="mean"), "--jk 'mean' is not valid; choose one of: none, last, sum, cat, max"),
        (dict(model="rgcn", arch="coupled", norm="layer"), "R-GCN's layers have none of them"),
        (dict(model="gat", overlap=True), "attention (--model gat)"),
        (dict(mode="data", overlap=True), "--mode data has none"),
        (dict(model="rgcn", input_dropout=0.0), "drop --input-dropout"),
        (dict(input_dropout=1.0), "--input-dropout 1.0 must be in [0, 1)"),
    ],
)
def test_options_the_model_would_ignore_are_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kwargs)
    assert message in str(err.value)


def test_configs_saved_by_older_versions_still_load() -> None:
    old = {"pipeline": True, "timeout_s": 30.0, "mode": "tp"}
    cfg = TrainConfig.from_dict(old)
    assert (cfg.overlap, cfg.collective_timeout_s) == (True, 30.0)


def test_errors_say_who_must_act() -> None:
    for exc in (ConfigError("x"), MemoryPlanError("x"), StoreError("x")):
        assert is_input_error(exc)
    assert not is_input_error(WorkerFailed("x")) and not is_input_error(RuntimeError("x"))


def test_an_impossible_memory_budget_is_refused_before_any_rank_starts(cora_store: str, tmp_path) -> None:
    results = tmp_path / "r.jsonl"
    spec = resolve(TrainConfig(store=cora_store, memory_budget="1KB", results=str(results)), nproc=2, device="cpu")
    with pytest.raises(MemoryPlanError, match="raise --memory-budget to at least"):
        launch_training(spec, on_line=lambda s: None)
    assert not results.exists(), "no rank ran"
    assert ntp_main(["train", "--store", cora_store, "--memory-budget", "1KB", "--no-track"]) == 2


def _records(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_ntp_train_without_nproc_runs_the_documented_default(cora_store: str, tmp_path, capsys) -> None:
    """Bug: `ntp train --store S` ran ONE process although --help promises all GPUs, else 2."""
    results = tmp_path / "r.jsonl"
    code = ntp_main(
        ["train", "--store", cora_store, "--epochs", "2", "--no-track", "--device", "cpu", "--results", str(results)]
    )
    assert code == 0
    expected = min(2, os.cpu_count() or 1)
    records = _records(results)
    assert len(records[0]["workers"]) == expected
    assert records[-1]["config"]["mode"] == ("tp" if expected > 1 else "single")
    out = capsys.readouterr().out
    assert "test acc" in out and f"results: {results}" in out, out


def test_a_config_file_mode_survives_torchrun(cora_store: str, tmp_path) -> None:
    """Bug: `torchrun -m ... --config run.yaml` with `mode: data` silently trained tensor parallel."""
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(f"mode: data\nstore: {cora_store}\nepochs: 2\nresults: {tmp_path / 'r.jsonl'}\n")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        f"--log-dir={tmp_path / 'torchrun'}",
        "-m",
        "ntp.run.worker",
        "--config",
        str(cfg_file),
        "--device",
        "cpu",
    ]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = _records(tmp_path / "r.jsonl")
    assert records[-1]["config"]["mode"] == "data"
    assert all("halo" in w["bytes_sent"] and "split" not in w["bytes_sent"] for w in records[0]["workers"])


def test_every_node_derives_the_same_job_id_from_the_same_command() -> None:
    def job(node_rank, **config) -> str:
        return resolve(
            TrainConfig(store="s", **config),
            nproc=2,
            nnodes=2,
            node_rank=node_rank,
            rdzv_endpoint="10.0.0.1:29500",
            gpus=0,
        ).job_id

    assert job(0) == job(1) == job(None) and job(0).startswith("gcn-")
    assert job(0, lr=0.02) != job(0), "another configuration is another job"
    assert resolve(TrainConfig(store="s"), nproc=2, gpus=0).job_id is None, "one node needs none"


def test_the_network_of_a_job_is_the_route_to_its_rendezvous(monkeypatch) -> None:
    from ntp.run.network import interface_of, is_local_address, job_network_env, route_address

    assert route_address("127.0.0.1", 29500) == "127.0.0.1" and interface_of("127.0.0.1") == "lo"
    assert is_local_address("127.0.0.1") and not is_local_address("192.0.2.1")  # TEST-NET-1: never ours
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "mine")
    assert job_network_env("127.0.0.1:29500") == {"GLOO_SOCKET_IFNAME": "lo"}, "the user's own setting is kept"
    assert job_network_env("127.0.0.1:29500", "eth9") == {"GLOO_SOCKET_IFNAME": "eth9", "NCCL_SOCKET_IFNAME": "eth9"}
