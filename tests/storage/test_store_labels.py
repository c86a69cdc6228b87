"""Multiclass labels are integer class ids in [0, C); -1 and NaN mean unlabelled; anything else is refused."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_helpers import quiet, writable_copy

from storage import StoreError, open_store, prepare

N = 6


@pytest.fixture
def edges(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("src,dst\n0,1\n1,2\n2,3\n4,5\n")
    return path


def build(tmp_path, edges, y, **kw):
    np.save(tmp_path / "y.npy", np.asarray(y))
    return prepare("toy", edges=edges, labels=tmp_path / "y.npy", data_dir=tmp_path, progress=quiet, **kw)


def test_float_label_with_a_fraction_is_refused(tmp_path, edges):
    with pytest.raises(StoreError, match=r"vertex 1 has label 1\.7, not an integer class id.*Fix:"):
        build(tmp_path, edges, [0.0, 1.7, 2.0, 1.0, 0.0, 1.0])


def test_huge_label_is_refused(tmp_path, edges):
    with pytest.raises(
        StoreError,
        match=r"vertex 2 has label 5000000, which would make 5,000,001 classes "
        r"for only 6 vertices.*--classes",
    ):
        build(tmp_path, edges, [0, 1, 5_000_000, 1, 0, 1])


def test_label_beyond_the_given_classes_is_refused(tmp_path, edges):
    with pytest.raises(StoreError, match=r"vertex 4 has label 3 but the dataset has 3 classes"):
        build(tmp_path, edges, [0, 1, 2, 1, 3, 1], classes=3)


def test_label_below_minus_one_is_refused(tmp_path, edges):
    with pytest.raises(StoreError, match=r"vertex 3 has label -2"):
        build(tmp_path, edges, [0, 1, 2, -2, 0, 1])


def test_unlabelled_stays_unlabelled(tmp_path, edges):
    store = open_store(build(tmp_path, edges, [0.0, np.nan, 2.0, -1.0, 1.0, 0.0]))
    assert store.labels().tolist() == [0, -1, 2, -1, 1, 0] and store.meta.num_classes == 3
    store = open_store(build(tmp_path, edges, np.array([0, 1, 1, -1, 0, 4], np.int32), classes=7))
    assert store.labels().tolist() == [0, 1, 1, -1, 0, 4] and store.meta.num_classes == 7


def test_parquet_labels_are_checked_too(tmp_path, edges):
    pq.write_table(pa.table({"label": [0.0, 1.0, 2.5, 0.0, 1.0, 2.0]}), tmp_path / "y.parquet")
    with pytest.raises(StoreError, match=r"vertex 2 has label 2\.5"):
        prepare("toy", edges=edges, labels=tmp_path / "y.parquet", data_dir=tmp_path, progress=quiet)


@pytest.mark.parametrize(
    "value, match", [("1.7", r"vertex 5 has label 1\.7"), ("5000000", r"vertex 5 has label 5000000, which would make")]
)
def test_ogb_folder_labels_are_checked(shared_datasets, tmp_path, value, match):
    folder = writable_copy(shared_datasets / "ogb-layout" / "cora", tmp_path / "cora")
    path = folder / "raw" / "node-label.csv.gz"
    rows = gzip.decompress(path.read_bytes()).decode().split("\n")
    rows[5] = value
    path.write_bytes(gzip.compress("\n".join(rows).encode()))
    with pytest.raises(StoreError, match=match):
        prepare("cora", from_dir=folder, data_dir=tmp_path, progress=quiet)


def test_ogb_metadata_bounds_the_labels(shared_datasets, tmp_path):
    """Under OGB's arxiv name the folder must have labels in [0, 40)."""
    folder = writable_copy(shared_datasets / "ogb-layout" / "cora", tmp_path / "arxiv")
    (folder / "split" / "public").rename(folder / "split" / "time")
    path = folder / "raw" / "node-label.csv.gz"
    rows = gzip.decompress(path.read_bytes()).decode().split("\n")
    rows[7] = "40"
    path.write_bytes(gzip.compress("\n".join(rows).encode()))
    with pytest.raises(StoreError, match=r"vertex 7 has label 40 but the dataset has 40 classes"):
        prepare("ogbn-arxiv", from_dir=folder, data_dir=tmp_path, progress=quiet)
