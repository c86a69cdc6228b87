"""`ntp predict` and `ntp evaluate` on the training launcher: the same predictions for 1, 2 and 3 ranks (torchrun,
chunked or not, Parquet or Zarr), equal to what training reported; link scores of given pairs; a model refused on a
store it does not fit. (Embeddings: tests/pipeline/test_predict_flow.py.)"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.tasks.link.pairs import score_pairs
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.records import read_results
from ntp.run.cli import main as ntp_main
from storage import open_store
from tests.ntp.test_link_run import link_store  # noqa: F401 (a fixture)

SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)


def _train(store: str, folder, **kw) -> tuple[str, object]:
    """A model trained in this process: its file and the final record training wrote."""
    cfg = TrainConfig(
        **{
            "store": store,
            "epochs": 10,
            "hidden": 16,
            "model_out": str(folder / "model.pt"),
            "results": str(folder / "results.jsonl"),
            **kw,
        }
    )
    fit(setup(cfg, SINGLE))
    return cfg.model_out, read_results(cfg.results).final


@pytest.fixture(scope="module")
def trained(cora_store: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    return _train(cora_store, tmp_path_factory.mktemp("trained"))


def _stacked(frame: pd.DataFrame, column: str) -> np.ndarray:
    return np.stack(frame[column].to_numpy())


@pytest.mark.slow
def test_predictions_of_1_2_3_ranks_are_identical_and_match_training(trained, cora_store, tmp_path, capsys) -> None:
    model, final = trained
    base = ["--model", model, "--store", cora_store]
    assert ntp_main(["predict", *base, "--out", str(tmp_path / "p1")]) == 0
    capsys.readouterr()
    assert ntp_main(["evaluate", *base, "--nproc", "2", "--out", str(tmp_path / "p2")]) == 0  # metrics + export
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # 3 ranks, chunked, into Zarr chunks of 500 rows that cross the ranks' row ranges (903, 903, 902 rows)
    assert (
        ntp_main(
            [
                "predict",
                *base,
                "--nproc",
                "3",
                "--chunk-rows",
                "700",
                "--format",
                "zarr",
                "--row-group",
                "500",
                "--out",
                str(tmp_path / "p3"),
            ]
        )
        == 0
    )
    assert metrics["test"] == final.test_metric and metrics["valid"] == final.best_valid_metric

    import zarr

    arrays = zarr.open_group(str(tmp_path / "p3"), mode="r")
    assert arrays["prob"].chunks == (500, 7)
    frames = [pd.read_parquet(tmp_path / f"p{n}") for n in (1, 2)]
    frames.append(
        pd.DataFrame({"node_id": np.arange(2708), "pred": arrays["pred"][:], "prob": list(arrays["prob"][:])})
    )
    assert len(list((tmp_path / "p2").glob("part-*.parquet"))) == 2  # one file per rank
    store = open_store(cora_store)
    for frame in frames:
        assert frame["node_id"].tolist() == list(range(store.meta.num_nodes))
        assert frame["pred"].tolist() == frames[0]["pred"].tolist()
        np.testing.assert_allclose(_stacked(frame, "prob"), _stacked(frames[0], "prob"), atol=1e-6)
    test = store.split("test")
    recomputed = float((frames[2]["pred"].to_numpy()[test] == store.labels()[test]).mean())
    assert recomputed == final.test_metric  # the test metric from the exported file is the one training reported
    assert json.loads((tmp_path / "p3" / "_ntp.json").read_text())["world_size"] == 3


def _synthetic(root, seed: int, features: int) -> str:
    from storage import prepare

    return str(
        prepare(
            "synthetic",
            nodes=60,
            avg_degree=3.0,
            features=features,
            classes=3,
            seed=seed,
            out=root / f"synthetic-{seed}-{features}",
            progress=lambda s: None,
        )
    )


def test_a_model_is_refused_on_a_store_it_does_not_fit(tmp_path, capsys) -> None:
    trained_on, other, wider = (_synthetic(tmp_path, 0, 6), _synthetic(tmp_path, 1, 6), _synthetic(tmp_path, 0, 7))
    model, _ = _train(trained_on, tmp_path, epochs=2)
    predict = ["predict", "--model", model, "--out", str(tmp_path / "out"), "--store"]
    assert ntp_main([*predict, wider, "--any-store"]) == 2  # another width: never
    err = capsys.readouterr().err
    assert "takes 6 features per node" in err and "has 7" in err and model in err
    assert ntp_main([*predict, other]) == 2  # another fingerprint: only when asked for
    assert "--any-store" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert ntp_main([*predict, other, "--any-store"]) == 0
    assert ntp_main([*predict, trained_on]) == 2  # the export exists
    assert "--overwrite" in capsys.readouterr().err
    assert ntp_main([*predict, trained_on, "--overwrite"]) == 0
    assert len(pd.read_parquet(tmp_path / "out")) == 60
    assert ntp_main([*predict, trained_on, "--overwrite", "--export", "scores", "--pairs", model]) == 2
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []  # no staging folder left


@pytest.mark.slow
def test_link_scores_of_given_pairs_match_the_model_for_1_and_2_ranks(link_store, tmp_path, capsys) -> None:  # noqa: F811
    from ntp.engine.infer.inference import single_process_job

    model, _ = _train(str(link_store), tmp_path, model="gcn", arch="coupled", epochs=3, dropout=0.0, link_batch=200)
    pairs = np.array([[0, 1], [2, 50], [119, 3], [5, 5], [64, 65]])
    np.save(tmp_path / "pairs.npy", pairs)
    base = ["predict", "--model", model, "--store", str(link_store), "--export", "scores"]
    for n in (1, 2):
        assert (
            ntp_main(
                [*base, "--pairs", str(tmp_path / "pairs.npy"), "--nproc", str(n), "--out", str(tmp_path / f"s{n}")]
            )
            == 0
        )
    one, two = (pd.read_parquet(tmp_path / f"s{n}").sort_values("pair", ignore_index=True) for n in (1, 2))
    assert one["pair"].tolist() == two["pair"].tolist() == list(range(len(pairs)))
    assert np.array_equal(two[["src", "dst"]].to_numpy(), pairs)
    job = single_process_job(model, link_store)
    with torch.no_grad():  # the scores the training's evaluation computes for the same pairs
        h_cols = job.ctx.to_graph(job.model(job.x, job.ctx))
        expected = score_pairs(job.model, h_cols, torch.from_numpy(pairs), job.comm).numpy()
    np.testing.assert_allclose(one["score"], expected, atol=1e-5)
    np.testing.assert_allclose(two["score"], expected, atol=1e-5)
    np.testing.assert_allclose(two["prob"], 1 / (1 + np.exp(-expected)), atol=1e-6)
    np.save(tmp_path / "bad.npy", np.array([[0, 120]]))
    assert ntp_main([*base, "--pairs", str(tmp_path / "bad.npy"), "--out", str(tmp_path / "bad")]) == 2
    assert "outside [0, 120)" in capsys.readouterr().err


def test_pairs_files_of_each_format_read_the_same(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ntp.engine.infer.exports import read_pairs

    pairs = np.array([[0, 1], [7, 3]])
    np.save(tmp_path / "p.npy", pairs)
    (tmp_path / "p.csv").write_text("src,dst\n0,1\n7,3\n")
    (tmp_path / "p.txt").write_text("0 1\n7 3\n")
    pq.write_table(pa.table({"src": pairs[:, 0], "dst": pairs[:, 1]}), tmp_path / "p.parquet")
    for name in ("p.npy", "p.csv", "p.txt", "p.parquet"):
        assert np.array_equal(read_pairs(tmp_path / name), pairs), name
    np.save(tmp_path / "bad.npy", np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"bad.npy holds float64 \(2, 3\); expected integer node ids \[k, 2\]"):
        read_pairs(tmp_path / "bad.npy")
    pq.write_table(pa.table({"u": [0]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['dst', 'src'\]"):
        read_pairs(tmp_path / "bad.parquet")
