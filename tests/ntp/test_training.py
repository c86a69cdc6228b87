"""The training loop on a real store: accuracy, torchrun launch, failures, resume, bad input."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError, TrainingError, WorkerFailed
from ntp.run.cli import main as ntp_main
from ntp.run.launch import launch_training
from ntp.spec import resolve
from tests.ntp.graphs import loader, random_graph, store_budget

SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)


def _records(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def _launch(cfg: TrainConfig, nproc: int, job_timeout_s: float | None = None, on_line=lambda s: None):
    return launch_training(resolve(cfg, nproc=nproc, device="cpu", job_timeout_s=job_timeout_s), on_line=on_line)


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_tensor_parallel_cora_accuracy_matches_single(model: str, cora_store: str, tmp_path) -> None:
    """Two torchrun ranks reach the single-process test accuracy on Cora (within 1 point), with balanced bytes."""
    cfg = TrainConfig(store=cora_store, model=model, epochs=60, hidden=32, lr=0.02, eval_every=5, seed=1)
    single = _launch(cfg.replace(mode="single", results=str(tmp_path / "single.jsonl")), 1)
    tp = _launch(cfg.replace(mode="tp", results=str(tmp_path / "tp.jsonl")), 2, job_timeout_s=300)
    ref, ours = _records(single.results_path), _records(tp.results_path)
    assert ref[-1]["test_metric"] > 0.75, f"{model} on Cora should learn (test accuracy {ref[-1]['test_metric']})"
    assert abs(ours[-1]["test_metric"] - ref[-1]["test_metric"]) <= 0.01
    losses, ref_losses = [r["loss"] for r in ours[:-1]], [r["loss"] for r in ref[:-1]]
    np.testing.assert_allclose(losses[:10], ref_losses[:10], rtol=1e-4)
    # Training amplifies the layouts' different summation orders; GAT's softmax about 10x every 10 epochs
    # (1e-5 of the loss at epoch 10, up to 3.4e-3 by epoch 60 on the CI machine); one step is exact in test_exactness
    np.testing.assert_allclose(losses, ref_losses, rtol={"gcn": 1e-4, "gat": 1e-2}[model])
    workers = ours[0]["workers"]
    assert [w["rank"] for w in workers] == [0, 1]
    sent = [sum(w["bytes_sent"].values()) for w in workers]
    assert max(sent) / min(sent) == 1.0
    assert all(w["peak_mem_bytes"] > 0 and w["compute_s"] > 0 for w in workers)


def test_memory_bounded_options_reach_torchrun_workers_and_keep_results(cora_store: str, tmp_path) -> None:
    """Budget chunks, offloaded embeddings, a CPU NN stage and pipelining, through `torchrun`: same losses. (And
    --monitor, which torchrun's parser took for an abbreviation of its --monitor-interval.)"""
    cfg = TrainConfig(store=cora_store, model="gcn", epochs=8, hidden=16, eval_every=4, seed=2, monitor="loss")
    ref = _launch(cfg.replace(mode="single", results=str(tmp_path / "ref.jsonl")), 1)
    lines: list[str] = []
    budget = store_budget(cora_store, 300_000, **{**cfg.to_dict(), "offload": "all"})
    bounded = cfg.replace(
        mode="tp",
        results=str(tmp_path / "tp.jsonl"),
        memory_budget=budget,
        offload="all",
        nn_device="cpu",
        overlap=True,
        threads=1,
    )
    ours = _launch(bounded, 2, job_timeout_s=300, on_line=lines.append)
    np.testing.assert_allclose(
        [r["loss"] for r in _records(ours.results_path)[:-1]],
        [r["loss"] for r in _records(ref.results_path)[:-1]],
        rtol=1e-5,
    )
    assert [r["valid_loss"] for r in _records(ours.results_path)[:-1]][3] > 0
    worker = _records(ours.results_path)[1]["workers"][1]
    assert worker["chunks"] > 1 and worker["offload"] == "all" and worker["nn_device"] == "cpu"
    assert worker["overlapped"] and worker["cpu_s"] > 0 and set(worker["peak_mem_by_phase"]) == {"nn", "propagate"}
    if (os.cpu_count() or 1) <= 2:  # two ranks fill this machine: the launcher says pipelining has nothing to overlap
        assert any("--overlap on CPU ranks that use all" in line for line in lines)


def test_crashed_rank_fails_the_job_promptly_with_its_traceback(cora_store: str, tmp_path) -> None:
    cfg = TrainConfig(
        store=cora_store,
        mode="tp",
        epochs=50,
        fail_rank=1,
        fail_at_epoch=2,
        collective_timeout_s=30,
        results=str(tmp_path / "r.jsonl"),
    )
    t0 = time.perf_counter()
    with pytest.raises(WorkerFailed) as err:
        _launch(cfg, 2, job_timeout_s=120)
    assert time.perf_counter() - t0 < 60
    message = str(err.value)
    assert "injected failure on rank 1 at epoch 2" in message
    assert "Traceback (most recent call last)" in message and "(rank 1)" in message


def test_job_timeout_kills_every_worker(cora_store: str, tmp_path) -> None:
    from tests.processes import processes_with

    cfg = TrainConfig(store=cora_store, mode="tp", epochs=100000, results=str(tmp_path / "r.jsonl"))
    with pytest.raises(WorkerFailed, match="timed out"):
        _launch(cfg, 2, job_timeout_s=15)
    assert not processes_with(str(tmp_path / "r.jsonl")), "torchrun and every worker are gone when it returns"


def test_resume_ends_like_an_uninterrupted_run(tmp_path) -> None:
    graph = random_graph(n=80, d=9, classes=3, seed=7)
    base = dict(model="gcn", epochs=8, hidden=8, dropout=0.5, checkpoint_every=3, eval_every=2, seed=2)
    whole = fit(setup(TrainConfig(**base, results=str(tmp_path / "a.jsonl")), SINGLE, loader(graph)))
    ckpt = str(tmp_path / "ckpt")
    fit(setup(TrainConfig(**{**base, "epochs": 5}, checkpoint_dir=ckpt), SINGLE, loader(graph)))  # "interrupted"
    resumed = fit(
        setup(
            TrainConfig(**base, checkpoint_dir=ckpt, resume=True, results=str(tmp_path / "b.jsonl")),
            SINGLE,
            loader(graph),
        )
    )
    a, b = _records(tmp_path / "a.jsonl"), _records(tmp_path / "b.jsonl")
    assert [r["epoch"] for r in b[:-1]] == list(range(8))
    assert [r["loss"] for r in b[:-1]] == pytest.approx([r["loss"] for r in a[:-1]], rel=1e-6)
    assert (resumed.best_epoch, resumed.test_metric) == (whole.best_epoch, whole.test_metric)


def test_non_finite_loss_stops_with_the_epoch() -> None:
    graph = random_graph(n=30, d=5, classes=2, seed=1)
    graph["x"][3, 2] = np.nan
    with pytest.raises(TrainingError, match="loss became nan at epoch 0"):
        fit(setup(TrainConfig(epochs=3), SINGLE, loader(graph)))


def test_graph_without_training_labels_is_refused() -> None:
    graph = random_graph(n=30, d=5, classes=2, seed=1)
    graph["splits"]["train"] = graph["splits"]["train"][:0]
    with pytest.raises(ConfigError, match="no labeled training vertex"):
        setup(TrainConfig(epochs=1), SINGLE, loader(graph))


def test_saved_model_evaluates_to_the_training_result(cora_store: str, tmp_path) -> None:
    from ntp.engine.infer.inference import evaluate_model

    cfg = TrainConfig(
        store=cora_store,
        epochs=20,
        hidden=16,
        model_out=str(tmp_path / "model.pt"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_every=20,
    )
    job = setup(cfg, SINGLE)
    final = fit(job)
    metrics = evaluate_model(tmp_path / "model.pt", cora_store)
    assert metrics["test"] == pytest.approx(final.test_metric)
    assert metrics["valid"] == pytest.approx(final.best_valid_metric)
    last = evaluate_model(tmp_path / "ckpt" / "ckpt-000019.pt", cora_store)  # a checkpoint: the last epoch's weights
    assert last["test"] == pytest.approx(job.history[-1].test_metric)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="gcnx"), "--model 'gcnx' is not valid; choose one of"),
        (dict(model="appnp", arch="coupled"), "use --arch decoupled"),
        (dict(dropout=1.0), "--dropout 1.0 must be in [0, 1)"),
        (dict(epochs=0), "--epochs 0 must be at least 1"),
        (dict(resume=True), "--resume needs --checkpoint-dir"),
    ],
)
def test_bad_config_says_how_to_fix_it(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kwargs)
    assert message in str(err.value)


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys) -> None:
    assert ntp_main(["train", "--store", str(tmp_path / "missing"), "--mode", "single", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "ntp data prepare" in err and "Traceback" not in err
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("model: sage\nhiddne: 3\n")
    assert ntp_main(["train", "--config", str(cfg_file), "--store", "x"]) == 2
    assert "unknown configuration keys ['hiddne']" in capsys.readouterr().err


def _binary_graph() -> dict:
    graph = random_graph(n=90, d=7, classes=2, seed=11)
    y = graph["y"].astype(np.float32).reshape(-1, 1)
    y[::9] = np.nan  # unlabeled vertices are skipped by the loss and the metric
    graph["y"] = y
    return graph


def binary_worker() -> list[float]:
    from ntp.engine.distributed.dist import distributed

    with distributed(30, "cpu") as env:
        job = setup(TrainConfig(mode="tp", epochs=4, hidden=8, dropout=0.3), env, loader(_binary_graph()))
        return [fit(job).test_metric, job.history[-1].loss]


def test_binary_task_trains_with_rocauc_and_tp_equals_single() -> None:
    from tests.ntp.spawn import run_on_ranks

    job = setup(TrainConfig(epochs=4, hidden=8, dropout=0.3), SINGLE, loader(_binary_graph()))
    assert (job.data.task_type, job.data.metric) == ("binary", "rocauc")
    single = fit(job)
    assert 0.0 <= single.test_metric <= 1.0
    for test_metric, loss in run_on_ranks(binary_worker, 2):
        assert test_metric == pytest.approx(single.test_metric, rel=1e-5)
        assert loss == pytest.approx(job.history[-1].loss, rel=1e-5)


def test_early_stopping_ends_after_patience_evaluations_without_progress() -> None:
    graph = random_graph(n=60, d=6, classes=3, seed=3)
    job = setup(TrainConfig(epochs=200, lr=0.5, patience=3, eval_every=1, hidden=4), SINGLE, loader(graph))
    final = fit(job)
    last = job.history[-1].epoch
    assert last < 199 and last == final.best_epoch + 3


def test_each_evaluated_epoch_records_its_evaluation_time() -> None:
    """eval_s: the seconds the evaluation after an epoch took (on top of epoch_s), None where none ran; an MLflow
    curve of its own."""
    from ntp.run.tracking.tables import epoch_metrics

    job = setup(TrainConfig(epochs=5, eval_every=2, hidden=4), SINGLE, loader(random_graph(n=60, d=6, classes=3)))
    fit(job)
    evaluated = [r.eval_s is not None for r in job.history]
    assert evaluated == [False, True, False, True, True]  # every 2nd epoch and the last
    assert all(r.eval_s > 0 for r in job.history if r.eval_s is not None)
    assert "eval_s" not in epoch_metrics(job.history[0]) and epoch_metrics(job.history[1])["eval_s"] > 0


def test_an_in_process_job_prints_through_the_callers_sink_as_a_torchrun_job_does(cora_store, capsys) -> None:
    """One rank trains in this process; its epoch lines still reach ``on_line`` (a Prefect task's log, a recipe's
    quiet runner), not this process's stdout."""
    lines: list[str] = []
    _launch(TrainConfig(store=cora_store, epochs=2, hidden=8, mode="single"), 1, on_line=lines.append)
    assert [line.split()[:2] for line in lines if line.startswith("epoch")] == [["epoch", "1/2"], ["epoch", "2/2"]]
    assert lines[-1].startswith("done: test acc") and capsys.readouterr().out == ""


def test_a_sink_that_prints_the_lines_it_keeps_prints_them_out(cora_store, capsys) -> None:
    """A quiet caller (bench/recipes.py) prints the lines it keeps: they reach stdout, not the job's redirection."""

    def keep_done(line: str) -> None:
        if line.startswith("done:"):
            print(f"kept {line}")

    _launch(TrainConfig(store=cora_store, epochs=2, hidden=8, mode="single"), 1, on_line=keep_done)
    assert capsys.readouterr().out.startswith("kept done: test acc")
