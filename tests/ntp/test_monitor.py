"""--monitor loss: the run keeps the epoch of lowest validation loss (the training loss over the valid split's rows,
as Shchur et al.'s benchmark selects) and --patience watches it; the loss is the same on 1-3 ranks and is the
cross-entropy that torch computes from the kept weights' predictions. Tasks that select by their own metric refuse it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import distributed
from ntp.engine.tasks.hetero.task import HeteroTask
from ntp.engine.tasks.link.task import LinkTask
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.engine.train.sinks import epoch_line
from ntp.errors import ConfigError
from ntp.records import EpochRecord
from ntp.run.tracking.tables import epoch_metrics
from tests.ntp.graphs import loader, random_graph
from tests.ntp.spawn import run_on_ranks


def _homophilous(n: int, seed: int) -> dict:
    """A random graph whose edges mostly join vertices of one class: propagation helps, then the model overfits."""
    graph, rng = random_graph(n=n, d=9, classes=3, seed=seed), np.random.default_rng(seed)
    y, src = graph["y"], graph["edge_index"][0]
    by_class = [np.flatnonzero(y == c) for c in range(3)]
    dst = [rng.choice(by_class[y[s]]) if rng.random() < 0.7 else rng.integers(0, n) for s in src]
    return {**graph, "edge_index": np.stack([src, np.asarray(dst)])}


GRAPH = _homophilous(90, seed=2)
#: a high rate on a small graph: the validation loss bottoms out and rises again within the epochs
BASE = dict(hidden=8, nn_layers=2, epochs=30, lr=0.1, dropout=0.0, weight_decay=0.0, seed=2, monitor="loss")
ARCHS = (dict(model="gcn", arch="coupled"), dict(model="sage", arch="coupled"), dict(model="gcn", arch="decoupled"))


def _runs(configs: list[dict], graph: dict) -> list[dict]:
    """Each config trained with the loop: every epoch's validation loss and metric, the final record, and the
    logits of the kept weights on this rank's rows (one process: all rows)."""
    out = []
    with distributed(60, "cpu") as env:
        for c in configs:
            job = setup(TrainConfig(mode="tp" if env.world > 1 else "single", **c), env, loader(graph))
            final = fit(job, sinks=[])
            job.model.load_state_dict(job.best.state)
            job.model.eval()
            with torch.no_grad():
                logits = job.model(job.x, job.ctx)
            out.append(
                {
                    "valid_loss": [r.valid_loss for r in job.history],
                    "valid": [r.valid_metric for r in job.history],
                    "test": [r.test_metric for r in job.history],
                    "final": final,
                    "logits": logits,
                }
            )
    return out


def test_the_kept_epoch_has_the_lowest_validation_loss_which_is_torchs_cross_entropy() -> None:
    configs = [dict(BASE, **a) for a in ARCHS]
    for config, run in zip(configs, _runs(configs, GRAPH), strict=True):
        losses, final = run["valid_loss"], run["final"]
        best = int(np.argmin(losses))
        assert final.best_epoch == best, config
        assert 0 < best < BASE["epochs"] - 1, "the test needs a minimum before the last epoch"
        assert final.test_metric == run["test"][best] and final.best_valid_metric == run["valid"][best]
        valid = torch.from_numpy(GRAPH["splits"]["valid"])
        expected = F.cross_entropy(run["logits"][valid], torch.from_numpy(GRAPH["y"])[valid]).item()
        assert losses[best] == pytest.approx(expected, rel=1e-5), config
    # by the metric instead, the same run keeps another epoch: the monitor decides
    by_metric = _runs([dict(BASE, **ARCHS[0], monitor="metric")], GRAPH)[0]
    assert by_metric["final"].best_epoch != _runs([configs[0]], GRAPH)[0]["final"].best_epoch


def test_the_validation_loss_is_the_same_on_1_to_3_ranks() -> None:
    configs = [dict(BASE, **a) for a in ARCHS]
    ref = _runs(configs, GRAPH)
    for world in (2, 3):
        got = run_on_ranks(_runs, world, configs, GRAPH)
        for rank in range(world):
            for config, mine, one in zip(configs, got[rank], ref, strict=True):
                assert mine["valid_loss"] == pytest.approx(one["valid_loss"], rel=1e-5), (world, rank, config)
                assert mine["final"].best_epoch == one["final"].best_epoch


def test_patience_counts_evaluations_without_a_lower_validation_loss() -> None:
    full = _runs([dict(BASE, **ARCHS[0])], GRAPH)[0]["valid_loss"]
    stale, stop = 0, None
    for epoch, loss in enumerate(full):
        stale = 0 if loss < min(full[:epoch], default=float("inf")) else stale + 1
        if stale == 3:
            stop = epoch
            break
    assert stop is not None and stop < BASE["epochs"] - 1
    (run,) = _runs([dict(BASE, **ARCHS[0], patience=3)], GRAPH)
    assert run["final"].epochs_run == stop + 1
    assert run["valid_loss"] == full[: stop + 1]


def test_tasks_that_select_by_their_own_metric_refuse_it() -> None:
    with pytest.raises(ConfigError, match="--monitor loss is for node classification; this store is link"):
        LinkTask().check(TrainConfig(monitor="loss"))
    with pytest.raises(ConfigError, match="--monitor loss is for node classification; this store is het"):
        HeteroTask().check(TrainConfig(model="rgcn", monitor="loss"))


def test_the_validation_loss_is_printed_and_tracked() -> None:
    rec = EpochRecord(epoch=4, loss=0.9, epoch_s=0.01, train_metric=0.8, valid_metric=0.7, test_metric=0.6)
    assert "valid loss" not in epoch_line(rec, 10, 1.0) and "valid_loss" not in epoch_metrics(rec)
    rec.valid_loss = 0.25
    assert "valid 0.7000  test 0.6000  valid loss 0.2500" in epoch_line(rec, 10, 1.0)
    assert epoch_metrics(rec)["valid_loss"] == 0.25
