"""--fit-on train+valid (the protocol of R-GCN's paper): the loss sees the train and the valid labels, the run keeps
the last epoch's weights and test metric and reports no validation metric, on 1-3 ranks, for node classifiers and
R-GCN; what needs a validation metric refuses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import distributed
from ntp.engine.tasks.link.task import LinkTask
from ntp.engine.train import checkpoint
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError
from ntp.records import FinalRecord
from ntp.run.repeats import RepeatSummary
from ntp.run.sweep.space import parse_space
from tests.ntp.graphs import loader, random_graph
from tests.ntp.hetero_worker import fit_runs, hetero_graph
from tests.ntp.spawn import run_on_ranks

GRAPH = random_graph(n=70, d=9, classes=3, seed=4)
EPOCHS = 4
NODE = dict(hidden=8, nn_layers=2, epochs=EPOCHS, lr=0.05, dropout=0.5, seed=2, fit_on="train+valid")
ARCHS = (dict(model="gcn", arch="coupled"), dict(model="sage", arch="coupled"), dict(model="gcn", arch="decoupled"))


def _with_splits(graph: dict, **splits) -> dict:
    return {**graph, "splits": {**graph["splits"], **splits}}


def _node_runs(configs: list[dict], graph: dict) -> list[dict]:
    """Each config trained on ``graph``: every epoch's loss and metrics, the final record, the kept weights."""
    out = []
    with distributed(60, "cpu") as env:
        for c in configs:
            job = setup(TrainConfig(mode="tp" if env.world > 1 else "single", **c), env, loader(graph))
            final = fit(job, sinks=[])
            out.append(
                {
                    "losses": [r.loss for r in job.history],
                    "valid": [r.valid_metric for r in job.history],
                    "test": [r.test_metric for r in job.history],
                    "final": final,
                    "kept": job.best.state,
                    "last": {k: v.detach().clone() for k, v in job.model.state_dict().items()},
                }
            )
    return out


def test_node_classifiers_train_on_both_splits_and_keep_the_last_epoch_on_1_to_3_ranks() -> None:
    splits = GRAPH["splits"]
    union = _with_splits(GRAPH, train=np.union1d(splits["train"], splits["valid"]), valid=splits["valid"][:0])
    configs = [dict(NODE, **a) for a in ARCHS]
    ref = _node_runs(configs, GRAPH)
    # the loss is the one of a store whose train split is train + valid, and not the train split's alone
    on_union = _node_runs([dict(c, fit_on="train") for c in configs], union)
    on_train = _node_runs([dict(c, fit_on="train") for c in configs], GRAPH)
    for r, u, t, arch in zip(ref, on_union, on_train, ARCHS):
        assert r["losses"] == u["losses"], arch
        assert r["losses"] != pytest.approx(t["losses"], rel=1e-3), arch
        final: FinalRecord = r["final"]
        assert final.best_epoch == EPOCHS - 1 and final.best_valid_metric is None, arch
        assert final.test_metric == r["test"][-1] and r["valid"] == [None] * EPOCHS, arch
        for key, value in r["last"].items():  # the weights kept are the last epoch's
            torch.testing.assert_close(r["kept"][key], value, rtol=0, atol=0)
    for world in (2, 3):
        for rank_runs in run_on_ranks(_node_runs, world, configs, GRAPH):
            for res, r, arch in zip(rank_runs, ref, ARCHS):
                where = f"{arch} on {world} ranks"
                assert res["losses"] == pytest.approx(r["losses"], rel=1e-5), where
                assert res["final"].best_epoch == EPOCHS - 1 and res["final"].best_valid_metric is None, where
                assert res["final"].test_metric == pytest.approx(r["final"].test_metric), where


def test_rgcn_keeps_its_whole_tables_of_the_last_epoch_on_1_and_2_ranks(tmp_path) -> None:
    base = dict(
        arch="coupled", hidden=6, nn_layers=2, lr=0.05, seed=1, epochs=EPOCHS, fit_on="train+valid", featureless=True
    )
    runs = {}
    for world in (1, 2):
        cfg = dict(base, mode="tp" if world > 1 else "single", model_out=str(tmp_path / f"model-{world}.pt"))
        runs[world] = run_on_ranks(fit_runs, world, [cfg], hetero_graph(seed=3))[0][0]
    for world, run in runs.items():
        assert run["best"][0] == EPOCHS - 1 and run["valid"] == [None] * EPOCHS
        saved = checkpoint.load(tmp_path / f"model-{world}.pt")["state_dict"]
        assert saved.keys() == run["state"].keys()
        for key, value in run["state"].items():  # whole tables (gathered from the ranks' columns), last epoch
            torch.testing.assert_close(saved[key], value, rtol=0, atol=0, msg=lambda m: f"{key}, {world} ranks: {m}")
    assert runs[2]["losses"] == pytest.approx(runs[1]["losses"], rel=1e-5)
    assert runs[2]["best"][1] == pytest.approx(runs[1]["best"][1])


def test_a_saved_model_is_evaluated_on_the_stores_own_splits(cora_store: str, tmp_path) -> None:
    from ntp.engine.infer.inference import evaluate_model

    cfg = TrainConfig(store=cora_store, epochs=3, hidden=8, fit_on="train+valid", model_out=str(tmp_path / "m.pt"))
    with distributed(60, "cpu") as env:
        final = fit(setup(cfg, env), sinks=[])
    metrics = evaluate_model(tmp_path / "m.pt", cora_store)
    assert metrics["test"] == pytest.approx(final.test_metric)
    assert 0.0 <= metrics["valid"] <= 1.0  # scored, though it was trained on


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(patience=5), "--patience watches the valid split"),
        (dict(lr_schedule="plateau"), "--lr-schedule plateau watches the valid split"),
        (dict(monitor="loss"), "--monitor loss watches the valid split.*drop --monitor, or use --fit-on train"),
        (dict(fit_on="valid"), "--fit-on 'valid' is not valid; choose one of: train, train\\+valid"),
    ],
)
def test_options_that_need_a_validation_metric_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{"fit_on": "train+valid", **options})


def test_link_prediction_and_sweeps_refuse_it() -> None:
    with pytest.raises(ConfigError, match="link prediction trains on the store's train edges"):
        LinkTask().check(TrainConfig(fit_on="train+valid"))
    with pytest.raises(ConfigError, match="remove fit_on"):
        parse_space({"space": {"lr": [0.01, 0.1]}, "fixed": {"fit_on": "train+valid"}})
    with pytest.raises(ConfigError, match="remove fit_on"):
        parse_space({"space": {"fit_on": ["train", "train+valid"]}})


def test_reports_say_the_last_epoch_was_kept_and_leave_the_validation_metric_out() -> None:
    final = FinalRecord(best_epoch=49, best_valid_metric=None, test_metric=0.97, metric="acc", world_size=2)
    assert final.kept_at() == "the last epoch 50 (trained on train+valid: no validation metric)"
    summary = RepeatSummary(
        metric="acc", tests=[0.9, 1.0], valids=[None, None], run_ids=[None, None], labels=["a", "b"]
    )
    assert "valid_mean" not in summary.metrics() and summary.metrics()["test_mean"] == pytest.approx(0.95)
    assert summary.lines()[0] == "a: test acc 0.9000"
    assert summary.lines()[-1].endswith("test acc 0.9500 +- 0.0707")
