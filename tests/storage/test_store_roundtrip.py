"""Cora and CiteSeer from the OGB layout match the Planetoid arrays exactly."""

from __future__ import annotations

import numpy as np
import pytest
from store_helpers import quiet

from storage import open_store, prepare
from storage.layout import Layout
from storage.schema import StoreError

CORA_CHUNKS = Layout(row_chunk=512, edge_chunk=2048, feature_row_chunk=256, feature_col_chunk=256)


def edge_set(store) -> set[tuple[int, int]]:
    indptr, indices = store.indptr(), store.indices()
    dst = np.repeat(np.arange(store.meta.num_nodes), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_round_trip(name, shared_datasets, tmp_path):
    ref = np.load(shared_datasets / "planetoid" / f"{name}.npz")
    path = prepare(name, from_dir=shared_datasets / "ogb-layout" / name, data_dir=tmp_path, progress=quiet)
    store = open_store(path)
    m = store.meta
    assert (m.num_nodes, m.num_edges, m.feature_dim) == (len(ref["y"]), ref["edge_index"].shape[1], ref["x"].shape[1])
    assert m.num_classes == int(ref["y"].max()) + 1
    assert (m.task_type, m.metric, m.num_tasks, m.ogb_name) == ("multiclass", "acc", 1, None)
    assert m.source["split"] == "public" and m.directed
    assert edge_set(store) == set(map(tuple, ref["edge_index"].T.tolist()))
    assert store.indices().dtype == np.int32 and store.indptr().dtype == np.int64
    np.testing.assert_array_equal(store.features(), ref["x"])
    np.testing.assert_array_equal(store.labels(), ref["y"])
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(store.split(split), np.sort(ref[f"{split}_idx"]))
    np.testing.assert_array_equal(store.in_degrees(), np.bincount(ref["edge_index"][1], minlength=m.num_nodes))
    np.testing.assert_array_equal(store.out_degrees(), np.bincount(ref["edge_index"][0], minlength=m.num_nodes))
    store.verify()


def test_partial_reads(shared_datasets, tmp_path):
    ref = np.load(shared_datasets / "planetoid" / "cora.npz")
    store = open_store(
        prepare(
            "cora",
            from_dir=shared_datasets / "ogb-layout" / "cora",
            data_dir=tmp_path,
            progress=quiet,
            layout=CORA_CHUNKS,
        )
    )
    np.testing.assert_array_equal(store.features(rows=slice(100, 300)), ref["x"][100:300])
    np.testing.assert_array_equal(store.features(cols=slice(5, 50)), ref["x"][:, 5:50])
    np.testing.assert_array_equal(store.features(slice(7, 9), slice(1000, 1433)), ref["x"][7:9, 1000:])
    indptr, indices = store.indptr(), store.indices()
    block = store.topology(500, 1300)
    assert (block.row_start, block.row_stop, block.weights) == (500, 1300, None)
    np.testing.assert_array_equal(block.indptr, indptr[500:1301] - indptr[500])
    np.testing.assert_array_equal(block.indices, indices[indptr[500] : indptr[1300]])
    whole = store.topology()
    np.testing.assert_array_equal(whole.indices, indices)
    with pytest.raises(ValueError, match="row range"):
        store.topology(10, 5)
    with pytest.raises(ValueError, match="step 1"):
        store.features(rows=slice(0, 10, 2))
    with pytest.raises(ValueError, match="no split"):
        store.split("holdout")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_features(dtype, tmp_path):
    base = open_store(prepare("synthetic", nodes=300, features=12, out=tmp_path / "a", progress=quiet))
    low = open_store(
        prepare("synthetic", nodes=300, features=12, out=tmp_path / "b", progress=quiet, feature_dtype=dtype)
    )
    x, y = base.features(), low.features()
    assert y.dtype == np.float32 and low.meta.feature_dtype == dtype
    np.testing.assert_allclose(y, x, rtol=1e-2 if dtype == "float16" else 8e-3, atol=1e-3)
    np.testing.assert_array_equal(low.features(slice(10, 20), slice(3, 7)), y[10:20, 3:7])
    assert low.meta.fingerprint != base.meta.fingerprint


def test_normalized_features_are_each_row_over_its_l1_norm(shared_datasets, tmp_path):
    """CiteSeer has 15 featureless vertices: they stay zero, every other row sums to one."""
    ref = np.load(shared_datasets / "planetoid" / "citeseer.npz")["x"]
    folder = shared_datasets / "ogb-layout" / "citeseer"
    plain = prepare("citeseer", from_dir=folder, data_dir=tmp_path, progress=quiet)
    path = prepare(
        "citeseer", from_dir=folder, data_dir=tmp_path, progress=quiet, layout=CORA_CHUNKS, normalize_features=True
    )
    store = open_store(path)
    sums = ref.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(store.features(), np.where(sums > 0, ref / np.maximum(sums, 1), 0), rtol=1e-6)
    assert (store.features()[sums[:, 0] == 0] == 0).all() and (sums == 0).sum() == 15
    assert path != plain and "--normalize-features" in store.meta.rebuild_command
    np.testing.assert_array_equal(store.indices(), open_store(plain).indices())


def test_normalized_features_are_refused_on_a_heterogeneous_graph(shared_datasets, tmp_path):
    with pytest.raises(StoreError, match="homogeneous graphs.*Fix: drop --normalize-features"):
        prepare("aifb", from_dir=shared_datasets / "ogb-hetero" / "aifb", out=tmp_path / "s", normalize_features=True)
    assert not (tmp_path / "s").exists()
