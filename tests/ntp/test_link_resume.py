"""Link prediction with learned node embeddings, sliced over ranks, resumes from a checkpoint as if never stopped:
the checkpoint holds the whole embedding matrix and the whole optimiser state of it, so a 2-rank run resumes on 2
ranks (the same numbers) and on 3 (the same up to summation order)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ntp.engine.train import checkpoint
from tests.ntp.link_worker import fit_run, link_graph
from tests.ntp.spawn import run_on_ranks

GRAPH = link_graph()
BASE = dict(
    model="gcn",
    arch="coupled",
    decoder="mlp",
    hidden=10,
    nn_layers=2,
    dropout=0.5,
    lr=0.02,
    seed=3,
    link_batch=37,
    weight_decay=0.0,
    eval_every=1,
    epochs=5,
    mode="tp",
)


def test_two_rank_link_run_resumes_like_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = run_on_ranks(fit_run, 2, BASE, GRAPH)[0]
    first = tmp_path / "first"
    run_on_ranks(fit_run, 2, {**BASE, "epochs": 2, "checkpoint_dir": str(first)}, GRAPH)  # stopped after 2 epochs
    state = checkpoint.load(checkpoint.latest_checkpoint(first))
    assert state["epoch"] == 1
    moments = [
        v for s in state["optimizer"]["state"].values() for v in s.values() if v.dim() == 2 and v.shape[0] == GRAPH["n"]
    ]  # the embeddings' Adam moments: whole, not rank 0's columns
    assert moments and all(v.shape == (GRAPH["n"], BASE["hidden"]) for v in moments)

    for world in (2, 3):  # the same ranks, and a checkpoint of 2 ranks resliced for 3
        ckpt = tmp_path / f"resume-{world}"
        shutil.copytree(first, ckpt)
        resumed = run_on_ranks(fit_run, world, {**BASE, "checkpoint_dir": str(ckpt), "resume": True}, GRAPH)[0]
        rel = 1e-6 if world == 2 else 1e-5
        assert resumed["losses"] == pytest.approx(whole["losses"], rel=rel), f"losses, resumed on {world} ranks"
        assert resumed["valid"] == pytest.approx(whole["valid"], abs=1.01 / 20)  # (a near tie may flip one of 20)
        assert resumed["best"][0] == whole["best"][0]
        torch.testing.assert_close(resumed["embedding"], whole["embedding"], rtol=rel * 10, atol=1e-6)


def test_the_embedding_is_gathered_whole_only_for_a_checkpoint(tmp_path: Path) -> None:
    """Gathering the whole matrix moves all of it: an epoch does so only when a checkpoint follows it (the weights the
    loop keeps as the best are gathered after the epoch, outside its traffic), not after every epoch."""
    plain = run_on_ranks(fit_run, 2, BASE, GRAPH)[0]
    assert plain["gathered"] == [0] * BASE["epochs"]
    saved = run_on_ranks(fit_run, 2, {**BASE, "checkpoint_dir": str(tmp_path), "checkpoint_every": 2}, GRAPH)[0]
    assert [b > 0 for b in saved["gathered"]] == [False, True, False, True, True]  # epochs 1, 3 and the last
    assert saved["losses"] == plain["losses"]
    # one gather an epoch at most: a kept epoch that also checkpoints reuses the checkpoint's
    kept = [e for e, v in enumerate(saved["valid"]) if v > max(saved["valid"][:e], default=float("-inf"))]
    assert kept and set(kept) & {1, 3, 4}, "the test needs an epoch that both keeps and checkpoints"
    assert saved["gathers"] == sorted(set(kept) | {1, 3, 4})
    assert plain["gathers"] == kept
    torch.testing.assert_close(saved["embedding"], plain["embedding"], rtol=0, atol=0)
