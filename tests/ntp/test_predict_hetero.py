"""`ntp predict` and `ntp evaluate` on an R-GCN model (the real IMDB folder): the rows are the target type's nodes,
with their ids within that type, the same for 1, 2 and 3 ranks, and the metrics are the ones training reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.records import read_results
from ntp.run.cli import main as ntp_main
from storage import open_store

IMDB = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "ogb-hetero" / "imdb"


@pytest.fixture(scope="module")
def imdb(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, object]:
    """An IMDB store, an R-GCN trained on it in this process, and the final record training wrote."""
    if not IMDB.is_dir():
        pytest.skip(f"shared data not found at {IMDB}")
    from storage import prepare

    root = tmp_path_factory.mktemp("imdb")
    store = str(prepare("imdb", from_dir=IMDB, out=root / "store", add_reverse=True, progress=lambda s: None))
    cfg = TrainConfig(
        store=store,
        model="rgcn",
        arch="coupled",
        epochs=4,
        hidden=8,
        eval_every=1,
        seed=5,
        model_out=str(root / "model.pt"),
        results=str(root / "results.jsonl"),
    )
    fit(setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None)))
    return store, cfg.model_out, read_results(cfg.results).final


@pytest.mark.slow
def test_rgcn_predictions_are_the_target_types_nodes_for_1_2_3_ranks(imdb, tmp_path, capsys) -> None:
    store_path, model, final = imdb
    store = open_store(store_path)
    target = next(t for t in store.meta.hetero["node_types"] if t["name"] == store.meta.hetero["target"])
    count, offset = target["count"], target["offset"]  # the store numbers all types' nodes in one id space
    assert count < sum(t["count"] for t in store.meta.hetero["node_types"])  # other types exist: the bug's setting
    base = ["--model", model, "--store", store_path]
    frames = []
    for nproc in (1, 2, 3):
        out = tmp_path / f"p{nproc}"
        assert ntp_main(["predict", *base, "--nproc", str(nproc), "--out", str(out)]) == 0
        frames.append(pd.read_parquet(out))
    for frame in frames:
        assert frame["node_id"].tolist() == list(range(count))  # ids within the target type, each once
        assert frame["pred"].tolist() == frames[0]["pred"].tolist()
        np.testing.assert_allclose(np.stack(frame["prob"]), np.stack(frames[0]["prob"]), atol=1e-6)
    test = store.split("test")
    exported = float((frames[2]["pred"].to_numpy()[test - offset] == store.labels()[test]).mean())
    assert exported == pytest.approx(final.test_metric, abs=1e-9)
    capsys.readouterr()
    assert ntp_main(["evaluate", *base, "--nproc", "2"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["test"] == pytest.approx(final.test_metric, abs=1e-9)
    assert metrics["valid"] == pytest.approx(final.best_valid_metric, abs=1e-9)


def test_rgcn_embeddings_in_zarr_cover_the_target_type(imdb, tmp_path) -> None:
    import zarr

    store_path, model, _ = imdb
    meta = open_store(store_path).meta
    count = next(t["count"] for t in meta.hetero["node_types"] if t["name"] == meta.hetero["target"])
    out = tmp_path / "emb"
    assert (
        ntp_main(
            [
                "predict",
                "--model",
                model,
                "--store",
                store_path,
                "--export",
                "embeddings",
                "--format",
                "zarr",
                "--nproc",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert zarr.open_group(str(out), mode="r")["embedding"].shape == (count, 8)  # the hidden layer (--hidden 8)
