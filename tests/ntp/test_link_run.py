"""Link prediction end to end: a store without features from an OGB link folder, a 2-rank torchrun job, the saved
model evaluated in one process (ntp evaluate), the task type in the results, MLflow and the Prefect parameters."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.infer.inference import evaluate_model
from ntp.records import read_results
from ntp.run import tracking
from ntp.run.launch import launch_training
from ntp.spec import resolve
from storage import open_store
from storage.prepare import prepare


def _community_folder(root: Path, n: int = 120, seed: int = 0) -> Path:
    """An OGB link-layout folder: 4 communities, edges within them; negatives across them."""
    rng = np.random.default_rng(seed)
    group = np.arange(n) % 4
    pairs = np.array([(u, v) for u in range(n) for v in range(u + 1, n) if group[u] == group[v] and rng.random() < 0.3])
    pairs = pairs[rng.permutation(len(pairs))]
    neg = rng.integers(0, n, (400, 2))
    neg = neg[group[neg[:, 0]] != group[neg[:, 1]]][:120]
    (root / "raw").mkdir(parents=True)
    (root / "split" / "random").mkdir(parents=True)
    train = pairs[:-80]
    with gzip.open(root / "raw/edge.csv.gz", "wt") as f:
        f.writelines(f"{u},{v}\n" for u, v in train)
    with gzip.open(root / "raw/num-node-list.csv.gz", "wt") as f:
        f.write(f"{n}\n")
    for part, d in {
        "train": {"edge": train},
        "valid": {"edge": pairs[-80:-40], "edge_neg": neg[:60]},
        "test": {"edge": pairs[-40:], "edge_neg": neg[60:]},
    }.items():
        torch.save(d, root / "split" / "random" / f"{part}.pt")
    return root


@pytest.fixture(scope="module")
def link_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("link")
    return prepare(
        "communities",
        from_dir=_community_folder(tmp / "folder"),
        out=tmp / "store",
        symmetrize=True,
        progress=lambda line: None,
    )


def test_two_ranks_train_and_one_process_evaluates(link_store: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(
        store=str(link_store),
        model="gcn",
        arch="coupled",
        hidden=16,
        epochs=30,
        lr=0.01,
        dropout=0.0,
        weight_decay=0.0,
        eval_every=5,
        link_batch=200,
        results=str(tmp_path / "r.jsonl"),
        model_out=str(tmp_path / "m.pt"),
        mode="tp",
    )
    lines: list[str] = []
    launch_training(resolve(cfg, nproc=2, device="cpu", job_timeout_s=300), on_line=lines.append)
    assert not [line for line in lines if "Warning" in line]
    final = read_results(tmp_path / "r.jsonl").final
    assert final is not None and final.task_type == "link" and final.metric == "hits@20"
    assert final.test_metric is not None and final.test_metric > 0.5, final  # communities are easy to tell apart
    ev = evaluate_model(tmp_path / "m.pt", link_store)  # one process: the saved embeddings are the whole matrix
    assert ev["task_type"] == "link" and ev["metric"] == "hits@20"
    assert ev["valid"] == pytest.approx(final.best_valid_metric, abs=1.5 / 40)  # at most one edge's rank may flip
    assert ev["test"] == pytest.approx(final.test_metric, abs=1.5 / 40)


def test_link_prediction_defaults_to_no_weight_decay_and_learns(link_store: Path) -> None:
    """--weight-decay left out is 0 for link prediction (OGB's examples), 5e-4 for node classifiers: under Adam, decay
    pulls the learned embeddings, whose gradients are small, to zero (on ogbl-ddi the loss stayed at 2 ln 2 for 10
    epochs with 5e-4); given, it is used as it is."""
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.train.loop import fit
    from ntp.engine.train.setup import setup

    def job(**options):
        cfg = TrainConfig(store=str(link_store), epochs=15, eval_every=5, link_batch=200, mode="single", **options)
        return setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None))

    default, decayed = job(), job(weight_decay=5e-4)
    assert [g["weight_decay"] for g in default.optimizer.param_groups] == [0.0]
    assert [g["weight_decay"] for g in decayed.optimizer.param_groups] == [5e-4]
    assert default.cfg.weight_decay == 0.0, "the job's config (saved with the model) holds the value it used"
    assert TrainConfig().for_task("multiclass").weight_decay == 5e-4
    assert TrainConfig(weight_decay=0.01).for_task("link").weight_decay == 0.01
    fit(default, sinks=[])
    fit(decayed, sinks=[])
    assert default.history[-1].loss < 1.0 < decayed.history[-1].loss, (default.history[-1], decayed.history[-1])


def test_a_checkpoint_written_with_the_old_default_decay_resumes_where_the_decay_is_the_same() -> None:
    """Checkpoints before the task's default hold --weight-decay 5e-4: a node classifier resumes with the option
    left out (the same decay), a link predictor is told that its decay changes (5e-4 -> 0)."""
    from ntp.engine.train.checkpoint import check_resumable
    from ntp.errors import CheckpointError

    state = {"config": TrainConfig(weight_decay=5e-4).to_dict(), "store_fingerprint": ""}
    check_resumable(state, Path("ckpt.pt"), TrainConfig().for_task("multiclass"), "", print)
    with pytest.raises(CheckpointError, match="--weight-decay 0.0005 -> 0.0"):
        check_resumable(state, Path("ckpt.pt"), TrainConfig().for_task("link"), "", print)


def test_mode_data_is_refused(link_store: Path) -> None:
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.train.setup import setup
    from ntp.errors import ConfigError

    with pytest.raises(ConfigError, match="link prediction runs tensor parallel"):
        setup(TrainConfig(store=str(link_store), mode="data"), DistEnv(0, 1, 0, 1, torch.device("cpu"), None))


def test_mlflow_and_prefect_carry_the_task(link_store: Path, tmp_path: Path) -> None:
    meta = open_store(link_store).meta.to_dict()
    with tracking.start_training_run(
        {"model": "gcn", "store": str(link_store)},
        world_size=2,
        store_meta=meta,
        store_path=link_store,
        system_metrics=False,
    ) as run:
        pass
    got = run.client.get_run(run.run_id).data
    assert got.tags["ntp.task_type"] == "link" and got.params["data.metric"] == "hits@20"
    rid = tracking.log_evaluation(
        None,
        {"train": 0.5, "valid": 0.4, "test": 0.3, "metric": "hits@20", "task_type": "link"},
        model_path=tmp_path / "m.pt",
        store=link_store,
    )
    assert run.client.get_run(rid).data.tags["eval.task_type"] == "link"

    from flows.params import DatasetOptions

    opts = DatasetOptions(
        name="cora",
        from_dir="../shared/datasets/ogb-layout/cora",
        link_split="0.05,0.1",
        out=str(tmp_path / "cora-link"),
    )
    store = open_store(prepare(opts.name, progress=lambda line: None, **opts.prepare_kwargs()))
    assert store.meta.task_type == "link" and store.meta.metric == "hits@20"
