"""Stores on S3-compatible object storage: a real S3 server (moto's, in server mode) on 127.0.0.1, a store built in
a folder and uploaded with s3fs, then read through its ``s3://`` URL exactly as from the folder: the same metadata,
arrays and training losses; a read fetches only the chunks it needs; what goes wrong names the fix.

Skipped when the ``s3`` extra (s3fs) or moto's server is not installed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="the s3 extra is not installed: pip install -e '.[s3]'")
moto_server = pytest.importorskip("moto.server", reason="moto's S3 server is not installed: pip install 'moto[server]'")

from storage import StoreError, open_store  # noqa: E402

BUCKET = "ntp-test"
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test-key",
    "AWS_SECRET_ACCESS_KEY": "test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class _Requests(logging.Handler):
    """The request lines moto's server (werkzeug) logs; while attached, werkzeug prints none."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def gets(self, key_prefix: str) -> set[str]:
        """Object keys under ``key_prefix`` fetched with GET since the last clear."""
        found = (re.search(r'"GET /([^? ]+)', line) for line in self.lines)
        keys = {m.group(1).removeprefix(f"{BUCKET}/") for m in found if m}
        return {key for key in keys if key.startswith(key_prefix)}


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, _Requests]]:
    """moto's S3 server on 127.0.0.1 with a bucket; the AWS_* variables point at it (subprocesses inherit them).
    Yields (endpoint URL, its request log)."""
    requests = _Requests()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(requests)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in {**_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}.items():
                mp.setenv(key, value)
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()
            s3fs.S3FileSystem().mkdir(BUCKET)
            yield endpoint, requests
    finally:
        server.stop()
        werkzeug.removeHandler(requests)


def _upload(local: Path, key: str) -> str:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.put(f"{local}/", f"{BUCKET}/{key}", recursive=True)
    return f"s3://{BUCKET}/{key}"


@pytest.fixture(scope="module")
def remote_store(s3, small_store: Path) -> str:
    return _upload(small_store, "stores/small")


def test_a_store_reads_the_same_from_s3_as_from_its_folder(remote_store: str, small_store: Path) -> None:
    local, remote = open_store(small_store), open_store(remote_store)
    assert remote.meta == local.meta and str(remote.location) == remote_store
    np.testing.assert_array_equal(remote.indptr(), local.indptr())
    np.testing.assert_array_equal(remote.indices(), local.indices())
    np.testing.assert_array_equal(
        remote.features(rows=slice(100, 700), cols=slice(3, 17)),
        local.features(rows=slice(100, 700), cols=slice(3, 17)),
    )
    np.testing.assert_array_equal(remote.labels(), local.labels())
    np.testing.assert_array_equal(remote.split("train"), local.split("train"))
    block, expected = remote.topology(300, 600), local.topology(300, 600)
    np.testing.assert_array_equal(block.indices, expected.indices)
    remote.verify()  # every chunk's checksum and the content hashes


def test_a_read_fetches_only_the_chunks_it_needs(s3, remote_store: str) -> None:
    _endpoint, requests = s3
    store = open_store(remote_store)
    requests.lines.clear()
    store.features(rows=slice(300, 520), cols=slice(8, 16))  # feature chunks are 128 rows x 8 columns
    assert requests.gets("stores/small/features/c/") == {f"stores/small/features/c/{r}/1" for r in (2, 3, 4)}


def test_ntp_data_info_reads_a_store_url(remote_store: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ntp.run.cli", "data", "info", remote_store, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["path"] == remote_store and info["num_nodes"] == 1000


def test_a_damaged_or_missing_remote_store_names_the_fix(s3, small_store: Path) -> None:
    import s3fs

    url = _upload(small_store, "stores/damaged")
    s3fs.S3FileSystem().rm(f"{BUCKET}/stores/damaged/indices/c/3")
    with pytest.raises(
        StoreError,
        match=r"chunk indices/c/3 of array 'indices' is missing.*upload the folder to "
        rf"{url} again",
    ):
        open_store(url)
    with pytest.raises(StoreError, match="nothing is stored there"):
        open_store(f"s3://{BUCKET}/stores/none")


def test_an_unreachable_object_store_fails_quickly_naming_the_settings(
    s3, small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="AWS_ENDPOINT_URL"):
        open_store(f"s3://{BUCKET}/stores/small")
    assert time.monotonic() - t0 < 60
    s3fs.S3FileSystem.clear_instance_cache()


def _losses(results: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, results.read_text().splitlines()) if "epoch" in r]


def test_training_on_a_store_url_equals_training_on_its_folder(
    remote_store: str, small_store: Path, tmp_path: Path
) -> None:
    losses = {}
    for name, store in (("local", str(small_store)), ("s3", remote_store)):
        results = tmp_path / f"{name}.jsonl"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "ntp.run.cli",
                "train",
                "--store",
                store,
                "--nproc",
                "2",
                "--device",
                "cpu",
                "--epochs",
                "2",
                "--no-track",
                "--results",
                str(results),
                "--job-timeout",
                "240",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        losses[name] = _losses(results)
    assert len(losses["s3"]) == 2 and losses["s3"] == losses["local"]
