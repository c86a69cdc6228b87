"""`ntp data prepare --largest-component`: only the largest connected component is kept, renumbered in order, with
its edges, weights, features, labels and splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_helpers import quiet

from storage import open_store
from storage.components import largest_component
from storage.prepare import prepare
from storage.schema import StoreError


def _rows(store) -> list[list[int]]:
    indptr, indices = store.indptr(), store.indices()
    return [indices[indptr[v] : indptr[v + 1]].tolist() for v in range(len(indptr) - 1)]


def test_the_largest_component_is_kept_with_everything_that_belongs_to_it(tmp_path: Path) -> None:
    # components {0, 2, 4, 6} (directed edges, weakly connected), {1, 5}, {3}
    pq.write_table(
        pa.table({"src": [0, 4, 6, 5], "dst": [2, 2, 4, 1], "weight": [0.5, 1.0, 2.0, 9.0]}), tmp_path / "e.parquet"
    )
    x = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.array([0, 1, 1, 0, -1, 1, 0]))
    (tmp_path / "splits").mkdir()
    np.save(tmp_path / "splits" / "train.npy", np.array([0, 1, 6]))
    np.save(tmp_path / "splits" / "valid.npy", np.array([3, 2]))
    np.save(tmp_path / "splits" / "test.npy", np.array([5, 4]))
    store = open_store(
        prepare(
            "edgelist",
            edges=tmp_path / "e.parquet",
            node_features=tmp_path / "x.npy",
            labels=tmp_path / "y.npy",
            splits=tmp_path / "splits",
            largest_component=True,
            data_dir=tmp_path,
            progress=quiet,
        )
    )
    # kept 0, 2, 4, 6 -> 0, 1, 2, 3; in-edges of each vertex: 1 <- 0, 2; 2 <- 3
    assert (store.meta.num_nodes, store.meta.num_edges) == (4, 3)
    assert _rows(store) == [[], [0, 2], [3], []]
    np.testing.assert_array_equal(store.edge_weights(), [0.5, 1.0, 2.0])
    np.testing.assert_array_equal(store.features(), x[[0, 2, 4, 6]])
    assert store.labels().tolist() == [0, 1, -1, 0]
    assert [store.split(s).tolist() for s in ("train", "valid", "test")] == [[0, 3], [1], [2]]
    assert store.meta.source["largest_component"] == {"nodes": 4, "of": 7}
    assert "--largest-component" in store.meta.rebuild_command


def test_of_two_equal_components_the_one_with_the_lowest_vertex_is_kept() -> None:
    keep = largest_component(6, np.array([4, 1, 3]), np.array([5, 2, 1]))  # {1, 2, 3}, {4, 5}, {0}
    assert keep.tolist() == [False, True, True, True, False, False]
    keep = largest_component(4, np.array([2, 0]), np.array([3, 1]))  # {0, 1}, {2, 3}
    assert keep.tolist() == [True, True, False, False]


def test_amazon_photo_keeps_the_component_shchur_et_al_evaluate(shared_datasets: Path, tmp_path: Path) -> None:
    path = prepare(
        "amazon-photo",
        from_dir=shared_datasets / "ogb-layout/amazon-photo",
        largest_component=True,
        random_splits=1,
        data_dir=tmp_path,
        progress=quiet,
    )
    store = open_store(path)
    assert (store.meta.num_nodes, store.meta.num_edges) == (7487, 2 * 119043)  # Pitfalls' Table 1 counts
    assert len(store.split("train")) == 20 * 8 and len(store.split("valid")) == 30 * 8


def test_a_heterogeneous_graph_is_refused(shared_datasets: Path, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="heterogeneous.*Fix: drop --largest-component"):
        prepare("aifb", from_dir=shared_datasets / "ogb-hetero/aifb", data_dir=tmp_path, largest_component=True)
