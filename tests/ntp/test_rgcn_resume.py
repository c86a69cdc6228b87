"""R-GCN with learned embeddings (a featureless type's table, and the one-hot first layer's tables), sliced over
ranks, resumes from a checkpoint as if never stopped: the checkpoint holds every whole table and its whole optimiser
state (Adam, and the row-wise Adam of --sparse-embeddings), so a 2-rank run resumes on 2 ranks (the same numbers)
and on 3 (the same up to summation order)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ntp.engine.train import checkpoint
from tests.ntp.hetero_worker import fit_runs, hetero_graph
from tests.ntp.spawn import run_on_ranks

GRAPH = hetero_graph(seed=2)  # (hidden 11: uneven column slices on 2 and 3 ranks)
BASE = dict(
    arch="coupled",
    hidden=11,
    nn_layers=2,
    dropout=0.5,
    lr=0.05,
    seed=3,
    weight_decay=0.0,
    eval_every=1,
    epochs=5,
    mode="tp",
)
CONFIGS = {
    "topic-table-adam": dict(BASE),  # papers and authors have features, topics an embedding table
    "one-hot-rowwise": dict(BASE, featureless=True, sparse_embeddings=True),  # stacked relation tables
    "one-hot-basis-adamw": dict(
        BASE, featureless=True, decomposition="basis", num_bases=2, optimizer="adamw", weight_decay=0.01
    ),
}
#: the state dict's keys of embedding tables
TABLES = ("input.embeddings.", "first.root.", "first.tables.", "first.bases.")


def _with(root: Path, **extra) -> list[dict]:
    return [dict(c, checkpoint_dir=str(root / name), **extra) for name, c in CONFIGS.items()]


def test_rgcn_with_learned_embeddings_resumes_like_an_uninterrupted_run(tmp_path: Path) -> None:
    # uninterrupted runs, and runs stopped after 2 epochs
    whole = run_on_ranks(fit_runs, 2, list(CONFIGS.values()) + _with(tmp_path / "first", epochs=2), GRAPH)[0]
    for name in CONFIGS:
        state = checkpoint.load(checkpoint.latest_checkpoint(tmp_path / "first" / name))
        assert state["epoch"] == 1
        tables = [v.shape for k, v in state["model"].items() if any(t in k for t in TABLES)]
        moments = [
            v.shape
            for s in state["optimizer"]["state"].values()
            for v in s.values()
            if v.dim() == 2 and v.shape in tables
        ]  # the tables' Adam moments: whole, not rank 0's columns
        assert tables and all(s[1] == BASE["hidden"] for s in tables), name
        assert len(moments) == 2 * len(tables), name

    for world in (2, 3):  # the same ranks, and a checkpoint of 2 ranks resliced for 3
        shutil.copytree(tmp_path / "first", tmp_path / f"resume-{world}")
        resumed = run_on_ranks(fit_runs, world, _with(tmp_path / f"resume-{world}", resume=True), GRAPH)[0]
        rel = 1e-6 if world == 2 else 1e-5
        for name, res, ref in zip(CONFIGS, resumed, whole):
            where = f"{name}, resumed on {world} ranks"
            assert res["losses"] == pytest.approx(ref["losses"], rel=rel), f"losses: {where}"
            assert res["best"][0] == ref["best"][0], where
            for key, w in ref["state"].items():
                torch.testing.assert_close(
                    res["state"][key], w, rtol=rel * 10, atol=1e-6, msg=lambda m: f"{key}: {where}\n{m}"
                )


def test_a_model_saved_when_no_epoch_was_kept_holds_the_last_whole_tables(tmp_path: Path) -> None:
    """With no validation split no epoch is kept as the best, and the saved model is the last weights: its sliced
    tables are gathered for it on every rank, not read from a snapshot that was never taken."""
    graph = {**GRAPH, "splits": {**GRAPH["splits"], "valid": np.zeros(0, dtype=np.int64)}}
    cfg = dict(CONFIGS["one-hot-rowwise"], model_out=str(tmp_path / "model.pt"))
    run = run_on_ranks(fit_runs, 2, [cfg], graph)[0][0]
    assert run["best"] == (-1, None)  # nothing kept
    saved = checkpoint.load(tmp_path / "model.pt")["state_dict"]
    assert saved.keys() == run["state"].keys()
    for key, value in run["state"].items():
        torch.testing.assert_close(saved[key], value, rtol=0, atol=0, msg=lambda m: f"{key}: {m}")
