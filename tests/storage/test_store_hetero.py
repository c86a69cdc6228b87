"""Heterogeneous stores from OGB's heterogeneous layout: the real AIFB and IMDB folders, --add-reverse, `ntp data
info`, and bad folders (each error names the file and the fix)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from storage import open_store, prepare
from storage.schema import StoreError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
AIFB, IMDB, CORA = SHARED / "ogb-hetero" / "aifb", SHARED / "ogb-hetero" / "imdb", SHARED / "ogb-layout" / "cora"
quiet = dict(progress=lambda s: None)


def _csv(path: Path) -> np.ndarray:
    with gzip.open(path, "rt") as f:
        return np.array([[float(v) for v in line.split(",")] for line in f if line.strip()])


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def tiny_folder(root: Path) -> Path:
    """paper (4 nodes, features, labels, split) and author (3 nodes, featureless); writes and cites."""
    _write(root / "raw/num-node-dict.csv.gz", ["author,paper", "3,4"])
    _write(root / "raw/triplet-type-list.csv.gz", ["author,writes,paper", "paper,cites,paper"])
    _write(root / "raw/relations/author___writes___paper/edge.csv.gz", ["0,0", "1,0", "2,3"])
    _write(root / "raw/relations/author___writes___paper/num-edge-list.csv.gz", ["3"])
    _write(root / "raw/relations/paper___cites___paper/edge.csv.gz", ["0,1", "1,2"])
    _write(root / "raw/relations/paper___cites___paper/num-edge-list.csv.gz", ["2"])
    _write(root / "raw/node-feat/paper/node-feat.csv.gz", ["1,0", "0,1", "1,1", "0,0"])
    _write(root / "raw/node-label/paper/node-label.csv.gz", ["0", "1", "0", "1"])
    for part, ids in (("train", "0\n1"), ("valid", "2"), ("test", "3")):
        _write(root / f"split/random/paper/{part}.csv.gz", [ids])
    return root


@pytest.fixture(scope="module")
def aifb_store(tmp_path_factory: pytest.TempPathFactory):
    if not AIFB.is_dir():
        pytest.skip(f"shared data not found at {AIFB}")
    return open_store(
        prepare("aifb", from_dir=AIFB, out=tmp_path_factory.mktemp("h") / "aifb", add_reverse=True, **quiet)
    )


def test_aifb_relations_labels_and_splits(aifb_store) -> None:
    meta = aifb_store.meta
    assert (meta.num_nodes, meta.num_edges, meta.num_classes) == (8285, 2 * 29043, 4)
    assert len(meta.hetero["relations"]) == 90 and meta.hetero["target"] == "entity"
    raw = _csv(AIFB / "raw/relations/entity___rdf_type___entity/edge.csv.gz").astype(np.int64)
    indptr, indices = aifb_store.relation_csr("entity___rdf_type___entity")
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    assert sorted(zip(indices.tolist(), dst.tolist())) == sorted(map(tuple, raw.tolist()))
    rev_ptr, rev_idx = aifb_store.relation_csr("rev_rdf_type")  # the reverse: every edge turned around
    rev_dst = np.repeat(np.arange(len(rev_ptr) - 1), np.diff(rev_ptr))
    assert sorted(zip(rev_dst.tolist(), rev_idx.tolist())) == sorted(map(tuple, raw.tolist()))
    assert [len(aifb_store.split(s)) for s in ("train", "valid", "test")] == [112, 28, 36]
    labels = aifb_store.labels()
    assert (labels[aifb_store.split("test")] >= 0).all() and (labels >= 0).sum() == 176
    aifb_store.verify()
    with pytest.raises(StoreError, match="unknown relation 'no_such'.*Fix: use one of"):
        aifb_store.relation_csr("no_such")


def test_imdb_per_type_features_and_info(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if not IMDB.is_dir():
        pytest.skip(f"shared data not found at {IMDB}")
    path = prepare("imdb", from_dir=IMDB, out=tmp_path / "imdb", **quiet)
    store = open_store(path)
    types = {t["name"]: t for t in store.meta.hetero["node_types"]}
    assert {t: v["count"] for t, v in types.items()} == {"actor": 5257, "director": 2081, "movie": 4278}
    assert store.meta.hetero["target"] == "movie" and store.meta.num_edges == 2 * (4278 + 12828)
    with gzip.open(IMDB / "raw/node-feat/director/node-feat.csv.gz", "rt") as f:
        first = np.array([float(v) for v in f.readline().split(",")], np.float32)
    assert store.type_features("director").shape == (2081, 3066)
    np.testing.assert_array_equal(
        store.type_features("director", rows=slice(0, 1), cols=slice(100, 200))[0], first[100:200]
    )
    movie0 = types["movie"]["offset"]
    y = store.labels()
    assert (y[:movie0] == -1).all() and (y[movie0:] >= 0).all()  # only the target type has labels
    from storage.cli import main

    assert main(["data", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "movie: 4278 nodes, 3066 features" in out and "(actor, acts_in, movie): 12828 edges" in out


def test_tiny_folder_and_reverse_relations(tmp_path: Path) -> None:
    store = open_store(
        prepare("tiny", from_dir=tiny_folder(tmp_path / "t"), out=tmp_path / "s", add_reverse=True, **quiet)
    )
    rels = {r["key"]: r for r in store.meta.hetero["relations"]}
    assert rels["paper___rev_writes___author"]["reverse_of"] == "author___writes___paper"
    indptr, indices = store.relation_csr("author___writes___paper")
    assert indptr.tolist() == [0, 2, 2, 2, 3] and indices.tolist() == [0, 1, 2]
    assert store.type_features("author").shape == (3, 0)  # featureless: models learn embeddings
    assert store.split("train").tolist() == [3, 4]  # global ids: authors first (num-node-dict's order)


@pytest.mark.parametrize(
    "damage,message",
    [
        (
            lambda r: _write(r / "raw/relations/paper___likes___paper/edge.csv.gz", ["0,1"]),
            r"raw/relations/paper___likes___paper: unknown relation name.*Fix: add the relation to triplet-type-list",
        ),
        (
            lambda r: _write(r / "split/random/author/train.csv.gz", ["0"]),
            r"split/random/author: a split on type 'author', which has no labels.*Fix: add that type's labels",
        ),
        (
            lambda r: _write(r / "raw/relations/author___writes___paper/num-edge-list.csv.gz", ["5"]),
            r"author___writes___paper/num-edge-list.csv.gz: says \[5\] edges but edge.csv.gz has 3 \(mismatched counts\)",
        ),
        (
            lambda r: _write(r / "raw/relations/paper___cites___paper/edge.csv.gz", ["0,1", "1,4"]),
            r"paper___cites___paper/edge.csv.gz: target ids range over \[1, 4\] but type 'paper' has 4 nodes",
        ),
        (
            lambda r: _write(r / "raw/node-feat/paper/node-feat.csv.gz", ["1,0", "0,1"]),
            r"raw/node-feat/paper/node-feat.csv.gz: has 2 rows but num-node-dict says 4 nodes.*mismatched counts",
        ),
        (
            lambda r: _write(r / "raw/triplet-type-list.csv.gz", ["author,writes,paper", "paper,cites,venue"]),
            r"relation paper___cites___venue names node type 'venue', which raw/num-node-dict.csv.gz does not list",
        ),
    ],
)
def test_bad_folders_name_the_file_and_the_fix(tmp_path: Path, damage, message: str) -> None:
    root = tiny_folder(tmp_path / "t")
    damage(root)
    with pytest.raises(StoreError, match=message):
        prepare("tiny", from_dir=root, out=tmp_path / "s", **quiet)
    assert not (tmp_path / "s").exists()


def test_add_reverse_is_for_heterogeneous_graphs(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="--add-reverse adds reverse relations.*Fix: drop --add-reverse"):
        prepare("cora", from_dir=CORA, out=tmp_path / "c", add_reverse=True, **quiet)
    with pytest.raises(StoreError, match="already exists. Fix: drop --add-reverse"):
        root = tiny_folder(tmp_path / "t")
        _write(
            root / "raw/triplet-type-list.csv.gz",
            ["author,writes,paper", "paper,cites,paper", "paper,rev_writes,author"],
        )
        _write(root / "raw/relations/paper___rev_writes___author/edge.csv.gz", ["0,0"])
        prepare("tiny", from_dir=root, out=tmp_path / "s", add_reverse=True, **quiet)
    shutil.rmtree(tmp_path / "t")
