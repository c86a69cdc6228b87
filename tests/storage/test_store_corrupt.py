"""Opening a damaged store raises StoreError naming the store, the problem and the fix."""

from __future__ import annotations

import json
import shutil

import pytest

from storage import StoreError, open_store


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
    expect_error(store_copy, "'features'", "missing", "Fix: rebuild it with `ntp data prepare synthetic",
                 f"--out {store_copy}")


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
