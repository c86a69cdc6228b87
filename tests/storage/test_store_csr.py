"""CSR construction: directed vs symmetrised, self-loops, duplicates, isolated vertices."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_helpers import quiet

import storage.csr as csr
from storage import StoreError, open_store, prepare
from storage.csr import CsrBuilder, Preprocessing

# 5 vertices; 3 and 4 are isolated. Edge 0->1 appears twice, 1->1 is a self-loop.
EDGES = [(0, 1), (0, 2), (2, 1), (1, 1), (0, 1)]


def rows(store) -> list[list[int]]:
    indptr, indices = store.indptr(), store.indices()
    return [indices[indptr[v] : indptr[v + 1]].tolist() for v in range(store.meta.num_nodes)]


@pytest.fixture
def edge_csv(tmp_path):
    path = tmp_path / "edges.csv"
    path.write_text("src,dst\n" + "".join(f"{s},{d}\n" for s, d in EDGES))
    return path


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, [[], [0, 0, 1, 2], [0], [], []]),
        ({"dedup": True}, [[], [0, 1, 2], [0], [], []]),
        ({"drop_self_loops": True}, [[], [0, 0, 2], [0], [], []]),
        ({"self_loops": True}, [[0], [0, 0, 1, 2], [0, 2], [3], [4]]),
        ({"symmetrize": True}, [[1, 2], [0, 1, 2], [0, 1], [], []]),
        ({"symmetrize": True, "drop_self_loops": True}, [[1, 2], [0, 2], [0, 1], [], []]),
    ],
)
def test_preprocessing(options, expected, edge_csv, tmp_path):
    store = open_store(prepare("toy", edges=edge_csv, nodes=5, data_dir=tmp_path, progress=quiet, **options))
    assert rows(store) == expected
    assert store.meta.directed == (not options.get("symmetrize"))
    assert store.meta.preprocessing["deduplicated"] == bool(options.get("dedup") or options.get("symmetrize"))
    n_edges = sum(map(len, expected))
    assert store.meta.num_edges == n_edges
    np.testing.assert_array_equal(store.in_degrees(), [len(r) for r in expected])
    out = np.bincount([u for r in expected for u in r], minlength=5)
    np.testing.assert_array_equal(store.out_degrees(), out)
    block = store.topology(3, 5)
    assert block.indptr.tolist() == [0, len(expected[3]), len(expected[3]) + len(expected[4])]
    _check_transpose(store, expected)


def _check_transpose(store, expected: list[list[int]]) -> None:
    """A directed store keeps the out-edge CSR (each source's targets, sorted) for start-up to read; a symmetrised
    one keeps none (A^T is A)."""
    if store.meta.preprocessing["symmetrized"]:
        assert "t_indices" not in store.meta.checksums
        return
    targets = [sorted(v for v, row in enumerate(expected) for src in row if src == u) for u in range(len(expected))]
    assert store._read("t_indices").tolist() == [v for row in targets for v in row]


def test_contradictory_options(edge_csv, tmp_path):
    with pytest.raises(StoreError, match="contradict"):
        prepare("toy", edges=edge_csv, self_loops=True, drop_self_loops=True, data_dir=tmp_path, progress=quiet)


def test_out_of_range_edge(edge_csv, tmp_path):
    with pytest.raises(StoreError, match=r"id 2 is outside \[0, 2\)"):
        prepare("toy", edges=edge_csv, nodes=2, data_dir=tmp_path, progress=quiet)


def reference_rows(src, dst, w, n, prep: Preprocessing):
    p = prep.effective()
    edges = list(zip(src.tolist(), dst.tolist(), w.tolist()))
    if p.drop_self_loops or p.self_loops:
        edges = [e for e in edges if e[0] != e[1]]
    if p.symmetrize:
        edges = edges + [(d, s, x) for s, d, x in edges]
    if p.self_loops:
        edges += [(v, v, 1.0) for v in range(n)]
    out = []
    for v in range(n):
        row = sorted(((s, x) for s, d, x in edges if d == v), key=lambda e: e[0])  # stable: first weight wins
        if p.dedup:
            row = [e for i, e in enumerate(row) if i == 0 or row[i - 1][0] != e[0]]
        out.append(row)
    return out


@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=3)))
def test_streaming_matches_reference(flags, tmp_path, monkeypatch):
    """Tiny blocks force many scatter and row-sort blocks; result equals a plain-Python build."""
    monkeypatch.setattr(csr, "BLOCK_EDGES", 7)
    rng = np.random.default_rng(0)
    n, e = 40, 300
    src, dst = rng.integers(0, n, e), rng.integers(0, n // 2, e)  # upper half has no in-edges
    w = rng.random(e).astype(np.float32)
    prep = Preprocessing(symmetrize=flags[0], dedup=flags[1], self_loops=flags[2])
    builder = CsrBuilder(n, "int32", tmp_path, True, prep, quiet)
    for start in range(0, e, 23):
        builder.add(src[start : start + 23], dst[start : start + 23], w[start : start + 23])
    got = builder.finish()
    ref = reference_rows(src, dst, w, n, prep)
    assert got.indptr.tolist() == np.cumsum([0] + [len(r) for r in ref]).tolist()
    assert got.indices.tolist() == [s for r in ref for s, _ in r]
    np.testing.assert_array_equal(got.weights, np.array([x for r in ref for _, x in r], np.float32))
    assert not list(tmp_path.glob("spill-*"))


def test_edgelist_with_everything(tmp_path):
    n = 6
    pq.write_table(
        pa.table({"src": [0, 1, 2, 0], "dst": [1, 2, 3, 1], "weight": [0.5, 1.0, 2.0, 9.0]}), tmp_path / "e.parquet"
    )
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.array([0, 1, 2, -1, 1, 0]))
    (tmp_path / "splits").mkdir()
    np.save(tmp_path / "splits" / "train.npy", np.array([2, 0]))
    (tmp_path / "splits" / "valid.csv").write_text("1\n4\n")
    (tmp_path / "splits" / "test.txt").write_text("5\n")
    store = open_store(
        prepare(
            "edgelist",
            edges=tmp_path / "e.parquet",
            node_features=tmp_path / "x.npy",
            labels=tmp_path / "y.npy",
            splits=tmp_path / "splits",
            dedup=True,
            data_dir=tmp_path,
            progress=quiet,
        )
    )
    m = store.meta
    assert (m.num_nodes, m.num_edges, m.feature_dim, m.num_classes, m.has_edge_weights) == (6, 3, 3, 3, True)
    assert rows(store) == [[], [0], [1], [2], [], []]  # vertices 4, 5 isolated
    np.testing.assert_array_equal(store.edge_weights(), [0.5, 1.0, 2.0])  # first copy's weight kept
    np.testing.assert_array_equal(store.topology(1, 3).weights, [0.5, 1.0])
    np.testing.assert_array_equal(store.features(), x)
    assert store.split("train").tolist() == [0, 2] and store.split("valid").tolist() == [1, 4]
    assert store.labels().tolist() == [0, 1, 2, -1, 1, 0]


def test_edgelist_rows_must_match(tmp_path, edge_csv):
    np.save(tmp_path / "x.npy", np.zeros((4, 2), np.float32))
    with pytest.raises(StoreError, match="node_features has 4 rows but the graph has 5"):
        prepare("toy", edges=edge_csv, node_features=tmp_path / "x.npy", nodes=5, data_dir=tmp_path, progress=quiet)


def test_ogb_name_from_dir_uses_ogb_metadata(shared_datasets, tmp_path):
    """Cora's files under OGB's products name: products adds inverse edges, so the store is symmetrised."""
    import shutil

    folder = tmp_path / "products"
    shutil.copytree(shared_datasets / "ogb-layout" / "cora", folder)
    (folder / "split" / "public").rename(folder / "split" / "sales_ranking")
    store = open_store(prepare("ogbn-products", from_dir=folder, data_dir=tmp_path, progress=quiet))
    ref = np.load(shared_datasets / "planetoid" / "cora.npz")
    m = store.meta
    assert (m.ogb_name, m.num_classes, m.directed) == ("ogbn-products", 47, False)
    assert m.num_edges == ref["edge_index"].shape[1]  # cora is already symmetric: A | A^T == A
