"""The heterophilous benchmarks' .npz (tolokers, chameleon_filtered): every split set in the store, `--split K`,
and ROC-AUC for 2-class tasks, computed from gathered scores: equal to scikit-learn's on 1 and 2 ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ntp.errors import ConfigError
from storage import open_store
from storage.prepare import prepare
from tests.ntp.metric_worker import metrics_and_probs
from tests.ntp.spawn import run_on_ranks

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets" / "heterophilous"
TOLOKERS = DATA / "tolokers.npz"
pytestmark = pytest.mark.skipif(not TOLOKERS.is_file(), reason="needs ../shared/datasets/heterophilous")


@pytest.fixture(scope="module")
def tolokers(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("stores") / "tolokers"
    return str(prepare("tolokers", from_npz=TOLOKERS, out=out, progress=lambda m: None))


def test_npz_store_keeps_every_split_set_and_the_papers_metric(tolokers: str, tmp_path) -> None:
    raw = np.load(TOLOKERS)
    store = open_store(tolokers)
    meta = store.meta
    assert (meta.num_nodes, meta.feature_dim, meta.num_classes) == (11758, 10, 2)
    assert meta.metric == "rocauc" and not meta.directed
    assert meta.num_edges == 2 * len(raw["edges"]), "each edge listed once, stored in both directions"
    np.testing.assert_array_equal(store.labels(), raw["node_labels"])
    np.testing.assert_array_equal(store.features(), raw["node_features"])
    for k in (0, 4, 9):
        for name, key in (("train", "train_masks"), ("valid", "val_masks"), ("test", "test_masks")):
            np.testing.assert_array_equal(store.split(name, k), np.flatnonzero(raw[key][k]))
    with pytest.raises(ValueError, match="--split 0..9"):
        store.split("train", 10)
    chameleon = prepare("chameleon", from_npz=DATA / "chameleon_filtered.npz", out=tmp_path / "c", progress=print)
    assert open_store(chameleon).meta.metric == "acc", "five classes: accuracy, as Platonov et al."


def test_rocauc_on_two_ranks_is_sklearns_on_the_gathered_scores(tolokers: str) -> None:
    cfg = dict(store=tolokers, model="gcn", arch="coupled", hidden=16, split=3, seed=1)
    two = run_on_ranks(metrics_and_probs, 2, cfg, 2)  # logits equal one process's: tests/ntp/test_exactness.py
    y = np.load(TOLOKERS)["node_labels"]
    probs = np.concatenate([p.numpy() for _, _, p, _ in two])  # ranks own consecutive rows
    for metrics, acc, _, splits in two:
        np.testing.assert_array_equal(splits["test"], np.flatnonzero(np.load(TOLOKERS)["test_masks"][3]))
        for name in ("train", "valid", "test"):
            ids = splits[name]
            assert metrics[name] == pytest.approx(roc_auc_score(y[ids], probs[ids, 1]), abs=1e-12)
            assert metrics[name] == two[0][0][name], "every rank reports the same number"
            assert acc[name] == pytest.approx(float((probs[ids].argmax(1) == y[ids]).mean()), abs=1e-12)


def test_a_split_set_the_store_lacks_is_refused(tolokers: str) -> None:
    from ntp.config import TrainConfig
    from ntp.engine.tasks.node.task import NodeTask

    with pytest.raises(ConfigError, match="choose 0..9"):
        NodeTask().check_store(TrainConfig(store=tolokers, split=10), open_store(tolokers))


@pytest.mark.parametrize("task", ["link", "hetero"])
@pytest.mark.parametrize("option", [{"split": 1}, {"metric": "rocauc"}, {"metric": "acc"}])
def test_split_and_metric_are_refused_where_the_store_has_one_of_each(task: str, option: dict) -> None:
    from ntp.config import TrainConfig
    from ntp.engine.tasks.hetero.task import HeteroTask
    from ntp.engine.tasks.link.task import LinkTask

    checker = {"link": LinkTask, "hetero": HeteroTask}[task]()
    model = {"link": "gcn", "hetero": "rgcn"}[task]
    checker.check(TrainConfig(store="s", model=model))  # the defaults pass
    with pytest.raises(ConfigError, match=f"--{next(iter(option))}: this store is .* drop them"):
        checker.check(TrainConfig(store="s", model=model, **option))
