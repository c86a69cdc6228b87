"""Inputs: a store is reused only for the same input bytes, and a damaged input is a StoreError naming it."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
from store_helpers import quiet, writable_copy

from storage import StoreError, open_store, prepare
from storage.inputs import CACHE_ENV
from storage.paths import temp_prefix


def relabel_keeping_size(path) -> tuple[int, int]:
    """Change one label in a gzipped label CSV so that the file keeps its size; (row, new label)."""
    rows = gzip.decompress(path.read_bytes()).decode().split("\n")
    base = gzip.compress("\n".join(rows).encode(), mtime=0)
    path.write_bytes(base)  # a canonical gzip, so that a size-keeping edit is easy to find
    for i in range(len(rows) - 1):
        changed = rows.copy()
        changed[i] = str((int(rows[i]) + 1) % 7)
        data = gzip.compress("\n".join(changed).encode(), mtime=0)
        if len(data) == len(base):
            return i, int(changed[i])
    raise AssertionError("no size-keeping edit found")


def edit_in_place(path, row_label) -> None:
    """Apply relabel_keeping_size's edit, keeping the size and the modification time."""
    i, label = row_label
    rows = gzip.decompress(path.read_bytes()).decode().split("\n")
    rows[i] = str(label)
    before = path.stat()
    path.write_bytes(gzip.compress("\n".join(rows).encode(), mtime=0))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


def test_same_size_edit_of_an_ogb_folder_rebuilds(shared_datasets, tmp_path):
    folder = writable_copy(shared_datasets / "ogb-layout" / "cora", tmp_path / "cora")
    labels = folder / "raw" / "node-label.csv.gz"
    edit = relabel_keeping_size(labels)
    first = prepare("cora", from_dir=folder, data_dir=tmp_path, progress=quiet)
    mine = prepare("cora", from_dir=folder, out=tmp_path / "mine", progress=quiet)
    old = open_store(first).labels()
    edit_in_place(labels, edit)
    second = prepare("cora", from_dir=folder, data_dir=tmp_path, progress=quiet)
    assert second != first, "a stale store was reused"
    new = open_store(second).labels()
    assert new[edit[0]] == edit[1] != old[edit[0]]
    with pytest.raises(StoreError, match="other inputs or options"):
        prepare("cora", from_dir=folder, out=mine, progress=quiet)  # never silently the old content


def test_same_size_edit_of_an_edgelist_rebuilds(tmp_path):
    (tmp_path / "e.csv").write_text("src,dst\n0,1\n1,2\n2,3\n")
    np.save(tmp_path / "y.npy", np.array([0, 1, 2, 1]))
    kw = dict(edges=tmp_path / "e.csv", labels=tmp_path / "y.npy", data_dir=tmp_path, progress=quiet)
    first = prepare("toy", **kw)
    np.save(tmp_path / "y.npy", np.array([0, 1, 2, 2]))
    second = prepare("toy", **kw)
    assert second != first and open_store(second).labels().tolist() == [0, 1, 2, 2]


def test_digests_are_cached(shared_datasets, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    lines: list[str] = []
    kw = dict(from_dir=shared_datasets / "ogb-layout" / "cora", data_dir=tmp_path, progress=lines.append)
    first = prepare("cora", **kw)
    assert any(line.startswith("hashing") for line in lines)
    lines.clear()
    assert prepare("cora", **kw) == first
    assert not any(line.startswith("hashing") for line in lines), lines


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "rel",
    [
        "raw/edge.csv.gz",
        "raw/node-feat.csv.gz",
        "raw/node-label.csv.gz",
        "raw/num-node-list.csv.gz",
        "split/public/train.csv.gz",
    ],
)
def test_truncated_gzip_names_the_file(shared_datasets, tmp_path, rel):
    folder = writable_copy(shared_datasets / "ogb-layout" / "cora", tmp_path / "cora")
    truncate(folder / rel)
    out = tmp_path / "stores" / "cora"
    with pytest.raises(StoreError, match=rf"{folder / rel}: cannot be read .*Fix: .*download"):
        prepare("cora", from_dir=folder, out=out, progress=quiet)
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(temp_prefix(out))]


def test_truncated_npy_features_name_the_file(tmp_path):
    (tmp_path / "e.csv").write_text("src,dst\n0,1\n")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    truncate(tmp_path / "x.npy")
    with pytest.raises(StoreError, match=r"x.npy: cannot be read"):
        prepare("toy", edges=tmp_path / "e.csv", node_features=tmp_path / "x.npy", data_dir=tmp_path, progress=quiet)


def test_a_folder_given_as_edge_file(tmp_path):
    (tmp_path / "edges").mkdir()
    with pytest.raises(StoreError, match=r"edges: cannot be read \(IsADirectoryError.*Fix: check the path"):
        prepare("toy", edges=tmp_path / "edges", data_dir=tmp_path, progress=quiet)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_input_names_permissions(tmp_path):
    (tmp_path / "e.csv").write_text("src,dst\n0,1\n")
    (tmp_path / "e.csv").chmod(0)
    with pytest.raises(StoreError, match=r"e.csv: cannot be read.*permissions"):
        prepare("toy", edges=tmp_path / "e.csv", data_dir=tmp_path, progress=quiet)


def test_out_below_a_file_is_a_store_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match=r"cannot build the graph store .*Fix: check that"):
        prepare("synthetic", nodes=100, out=tmp_path / "afile" / "store", progress=quiet)
