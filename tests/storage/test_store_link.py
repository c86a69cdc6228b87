"""Link-prediction stores: OGB's link layout (ogbl-ddi as shipped, and small folders with bad input), safe loading of
the .pt split files, and --link-split of any homogeneous graph."""

from __future__ import annotations

import datetime
import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from storage import open_store
from storage.cli import main
from storage.prepare import prepare
from storage.schema import StoreError
from storage.sources.link_arrays import load_split_file

DDI = Path("../shared/datasets/ogb-link/ogbl-ddi")
CORA = Path("../shared/datasets/ogb-layout/cora")


def _quiet(_: str) -> None:
    pass


def _edge_keys(store) -> set[tuple[int, int]]:
    indptr, indices = store.indptr(), store.indices()
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


def _folder(root: Path, n: int, splits: dict[str, dict], suffix: str = ".pt") -> Path:
    (root / "raw").mkdir(parents=True)
    (root / "split" / "random").mkdir(parents=True)
    train = splits["train"]["edge"]
    with gzip.open(root / "raw/edge.csv.gz", "wt") as f:
        f.writelines(f"{u},{v}\n" for u, v in train)
    with gzip.open(root / "raw/num-node-list.csv.gz", "wt") as f:
        f.write(f"{n}\n")
    for part, d in splits.items():
        path = root / "split" / "random" / f"{part}{suffix}"
        if suffix == ".pt":
            torch.save(d, path)
        else:
            np.savez(path, **d)
    return root


def _pairs(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return rng.integers(0, n, (k, 2)).astype(np.int64)


def _small_splits(n: int = 30) -> dict[str, dict]:
    rng = np.random.default_rng(0)
    return {
        "train": {"edge": _pairs(rng, n, 60)},
        "valid": {"edge": _pairs(rng, n, 10), "edge_neg": _pairs(rng, n, 12)},
        "test": {"edge": _pairs(rng, n, 10), "edge_neg": _pairs(rng, n, 12)},
    }


def test_ogbl_ddi_as_shipped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = prepare("ogbl-ddi", from_dir=DDI, data_dir=tmp_path, progress=_quiet)
    assert main(["data", "info", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "task_type         link" in shown and "metric            hits@20" in shown
    assert "link valid        133489 positive edges, 101882 negatives [101882, 2]" in shown
    store = open_store(path)
    m = store.meta
    assert (m.task_type, m.metric, m.num_nodes, m.feature_dim, m.ogb_name) == ("link", "hits@20", 4267, 0, "ogbl-ddi")
    assert m.num_edges == 2 * 1067911  # OGB adds the inverse of every training edge
    sizes = {s: tuple(len(a) if a is not None else None for a in store.link_split(s)) for s in m.split_names}
    assert sizes == {"train": (1067911, None), "valid": (133489, 101882), "test": (133489, 95599)}
    graph = _edge_keys(store)
    for split in ("valid", "test"):  # the message-passing graph holds no validation or test edge
        pos = store.link_split(split)[0]
        assert not any((u, v) in graph or (v, u) in graph for u, v in pos[:2000].tolist())
    train = store.link_split("train")[0]
    assert all((u, v) in graph and (v, u) in graph for u, v in train[:2000].tolist())
    store.verify()


def test_pt_and_npz_splits_give_the_same_store(tmp_path: Path) -> None:
    splits = _small_splits()
    a = open_store(prepare("lp", from_dir=_folder(tmp_path / "pt", 30, splits), out=tmp_path / "a", progress=_quiet))
    b = open_store(
        prepare("lp", from_dir=_folder(tmp_path / "npz", 30, splits, ".npz"), out=tmp_path / "b", progress=_quiet)
    )
    for s in ("train", "valid", "test"):
        for x, y, ref in zip(a.link_split(s), b.link_split(s), (splits[s]["edge"], splits[s].get("edge_neg"))):
            assert (x is None and ref is None) or (np.array_equal(x, ref) and np.array_equal(y, ref))
    assert a.meta.metric == "hits@20" and a.meta.task_type == "link"
    assert np.array_equal(a.indices(), b.indices())


def test_node_id_past_the_count_is_refused(tmp_path: Path) -> None:
    splits = _small_splits()
    splits["valid"]["edge_neg"][3] = [5, 30]
    with pytest.raises(StoreError, match=r"negative edge 3 of split 'valid' \(\[5, 30\]\).*outside \[0, 30\)"):
        prepare("lp", from_dir=_folder(tmp_path / "f", 30, splits), out=tmp_path / "s", progress=_quiet)


def test_split_without_negatives_is_refused(tmp_path: Path) -> None:
    splits = _small_splits()
    del splits["test"]["edge_neg"]
    with pytest.raises(StoreError, match="split 'test' has no negative edges, but metric hits@20.*Fix"):
        prepare("lp", from_dir=_folder(tmp_path / "f", 30, splits), out=tmp_path / "s", progress=_quiet)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


@pytest.mark.parametrize(
    "extra,needs", [(datetime.date(2020, 1, 1), "datetime.date"), (_Boom(), "posix.system")], ids=["date", "os.system"]
)
def test_pt_with_other_globals_is_refused(tmp_path: Path, extra: object, needs: str) -> None:
    path = tmp_path / "valid.pt"
    torch.save({"edge": np.zeros((2, 2), np.int64), "extra": extra}, path)
    expected = rf"split file {path} is not an allowed split file.*it refers to {needs}, which is not allowed.*Fix"
    with pytest.raises(StoreError, match=expected) as excinfo:
        load_split_file(path)
    assert "weights_only` set to `False`" not in str(excinfo.value)  # torch's advice to load unsafely is not passed on


def test_pt_that_is_not_a_dict_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "train.pt"
    torch.save([np.zeros((2, 2), np.int64)], path)
    with pytest.raises(StoreError, match="holds a list, not a dict"):
        load_split_file(path)


def test_link_split_of_a_node_dataset(tmp_path: Path) -> None:
    store = open_store(
        prepare("cora", from_dir=CORA, out=tmp_path / "a", link_split="0.05,0.1", seed=1, progress=_quiet)
    )
    again = open_store(
        prepare("cora", from_dir=CORA, out=tmp_path / "b", link_split="0.05,0.1", seed=1, progress=_quiet)
    )
    other = open_store(
        prepare("cora", from_dir=CORA, out=tmp_path / "c", link_split="0.05,0.1", seed=2, progress=_quiet)
    )
    assert store.meta.task_type == "link" and store.meta.feature_dim == 1433
    pairs = {s: store.link_split(s) for s in ("train", "valid", "test")}
    undirected = 10556 // 2
    assert len(pairs["valid"][0]) == round(0.05 * undirected) and len(pairs["test"][0]) == round(0.1 * undirected)
    assert len(pairs["train"][0]) + len(pairs["valid"][0]) + len(pairs["test"][0]) == undirected
    graph = _edge_keys(store)
    assert len(graph) == 2 * len(pairs["train"][0])  # training pairs, both ways
    cora = np.load("../shared/datasets/planetoid/cora.npz")["edge_index"]
    all_edges = set(zip(cora[0].tolist(), cora[1].tolist()))
    for s in ("valid", "test"):
        pos, neg = pairs[s]
        assert len(neg) == len(pos)
        assert not any((u, v) in graph or (v, u) in graph for u, v in pos.tolist())  # no leak, either direction
        assert all((u, v) in all_edges for u, v in pos.tolist())
        assert not any((u, v) in all_edges or u == v for u, v in neg.tolist())
    assert np.array_equal(again.link_split("valid")[1], pairs["valid"][1])  # seeded
    assert not np.array_equal(other.link_split("valid")[0], pairs["valid"][0])


def test_link_split_input_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="--link-split '0.5' is not two fractions"):
        prepare("cora", from_dir=CORA, out=tmp_path / "a", link_split="0.5", progress=_quiet)
    with pytest.raises(StoreError, match="sum below 1"):
        prepare("cora", from_dir=CORA, out=tmp_path / "a", link_split="0.5,0.6", progress=_quiet)
    with pytest.raises(StoreError, match="already a link-prediction dataset"):
        prepare(
            "lp",
            from_dir=_folder(tmp_path / "f", 30, _small_splits()),
            out=tmp_path / "s",
            link_split="0.1,0.1",
            progress=_quiet,
        )
