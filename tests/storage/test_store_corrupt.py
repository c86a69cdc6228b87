"""Opening a damaged store raises StoreError naming the store, the problem and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
from store_helpers import quiet

from storage import StoreError, open_store, prepare
from storage.cli import main


def expect_error(path, *fragments: str) -> str:
    with pytest.raises(StoreError) as info:
        open_store(path)
    msg = str(info.value)
    assert str(path) in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


def edit_attrs(path, **changes) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"].update(changes)
    (path / "zarr.json").write_text(json.dumps(doc))


def test_valid_copy_opens(store_copy):
    open_store(store_copy).verify()


def test_missing_array(store_copy):
    shutil.rmtree(store_copy / "features")
    expect_error(
        store_copy, "'features'", "missing", "Fix: rebuild it with `ntp data prepare synthetic", f"--out {store_copy}"
    )


def test_missing_chunk(store_copy):
    (store_copy / "indices" / "c" / "2").unlink()
    expect_error(store_copy, "chunk indices/c/2", "missing", "ntp data prepare")


def test_truncated_chunk(store_copy):
    chunk = store_copy / "features" / "c" / "1" / "1"
    chunk.write_bytes(chunk.read_bytes()[:-10])
    expect_error(store_copy, "chunk features/c/1/1", "truncated", "ntp data prepare")


def test_corrupt_chunk_bytes(store_copy):
    chunk = store_copy / "indices" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    store = open_store(store_copy)  # same size: only a read notices
    with pytest.raises(StoreError, match="'indices' cannot be read.*checksum.*ntp data prepare"):
        store.indices()
    with pytest.raises(StoreError, match="indices"):
        store.verify()


def test_wrong_schema_version(store_copy):
    edit_attrs(store_copy, schema_version=99)
    expect_error(store_copy, "schema_version is 99", "reads version 1", "ntp data prepare synthetic")


def test_missing_metadata_field(store_copy):
    doc = json.loads((store_copy / "zarr.json").read_text())
    del doc["attributes"]["num_classes"]
    (store_copy / "zarr.json").write_text(json.dumps(doc))
    expect_error(store_copy, "'num_classes' is missing", "ntp data prepare")


@pytest.mark.parametrize("field", ["num_edges", "num_nodes", "feature_dim"])
def test_mismatched_counts(store_copy, field):
    attrs = json.loads((store_copy / "zarr.json").read_text())["attributes"]
    edit_attrs(store_copy, **{field: attrs[field] + 1})
    expect_error(store_copy, "mismatched counts", "ntp data prepare")


def test_no_metadata_at_all(store_copy):
    (store_copy / "zarr.json").unlink()
    expect_error(store_copy, "zarr.json is missing", "ntp data prepare")


def test_not_a_directory(tmp_path):
    expect_error(tmp_path / "nothing", "no such store directory", "ntp data prepare")


@pytest.mark.parametrize(
    "delta, fragment",
    [(1, "num_classes is 5 but the labels use 4 classes"), (-1, "num_classes is 3 but the labels range over [0, 3]")],
)
def test_verify_recomputes_num_classes(store_copy, delta, fragment):
    edit_attrs(store_copy, num_classes=4 + delta)
    store = open_store(store_copy)  # shapes still agree: only reading the labels tells
    with pytest.raises(StoreError) as info:
        store.verify()
    assert fragment in str(info.value) and "Fix: rebuild it with `ntp data prepare synthetic" in str(info.value)


def test_info_verify_reports_an_edited_num_classes(store_copy, capsys):
    edit_attrs(store_copy, num_classes=5)
    assert main(["data", "info", str(store_copy)]) == 0  # the quick check cannot know
    capsys.readouterr()
    assert main(["data", "info", str(store_copy), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "num_classes is 5" in err and f"--out {store_copy}" in err and err.count("\n") == 1


@pytest.mark.parametrize("doc", ["[1, 2]", "null", "42", '"a string"'])
def test_zarr_json_that_is_not_an_object(store_copy, doc):
    (store_copy / "zarr.json").write_text(doc)
    expect_error(store_copy, "zarr.json holds a JSON", "not an object", "Fix:")
    with pytest.raises(StoreError, match="not a graph store"):
        prepare("synthetic", nodes=50, out=store_copy, progress=quiet, force=True)
    assert (store_copy / "indices").is_dir()  # never deleted: it no longer proves to be ours


def test_zarr_json_that_zarr_rejects(store_copy):
    doc = json.loads((store_copy / "zarr.json").read_text())
    doc["zarr_format"] = 99
    (store_copy / "zarr.json").write_text(json.dumps(doc))
    expect_error(store_copy, "not a valid Zarr group", "ntp data prepare synthetic")
