"""Downloading an OGB zip from a mirror on 127.0.0.1, and failing fast on dead servers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from store_helpers import REPO, quiet

from storage import StoreError, open_store, prepare


def make_ogb_zip(src: Path, dest_dir: Path, folder: str, split: str) -> Path:
    """Zip an OGB-layout folder as OGB does: <folder>/raw/..., <folder>/split/<split>/..."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    zip_path = dest_dir / f"{folder}.zip"
    with zipfile.ZipFile(zip_path, "w") as zf:
        for f in sorted(src.rglob("*")):
            if f.is_file():
                rel = f.relative_to(src).as_posix().replace("split/public/", f"split/{split}/")
                zf.write(f, f"{folder}/{rel}")
    return zip_path


def test_download_from_mirror(http_root, shared_datasets, tmp_path):
    root, url = http_root
    # Cora's files dressed up as OGB's arxiv.zip (arxiv: directed, split "time", 40 classes).
    make_ogb_zip(shared_datasets / "ogb-layout" / "cora", root / "ogb", "arxiv", "time")
    data = tmp_path / "data"
    path = prepare("ogbn-arxiv", mirror=url, data_dir=data, progress=quiet)
    store = open_store(path)
    ref = np.load(shared_datasets / "planetoid" / "cora.npz")
    assert store.meta.ogb_name == "ogbn-arxiv" and store.meta.num_classes == 40
    assert store.meta.num_edges == ref["edge_index"].shape[1] and store.meta.directed
    np.testing.assert_array_equal(store.labels(), ref["y"])
    assert (data / "raw" / "arxiv.zip").is_file() and (data / "raw" / "arxiv" / "raw").is_dir()
    assert f"--mirror {url}" in store.meta.rebuild_command
    # Idempotent, and the cached download is reused (the server is no longer needed).
    (root / "ogb" / "arxiv.zip").unlink()
    assert prepare("ogbn-arxiv", mirror=url, data_dir=data, progress=quiet) == path
    assert prepare("ogbn-arxiv", mirror=url, data_dir=data, progress=quiet, force=True) == path


def test_missing_file_on_mirror(http_root, tmp_path):
    _, url = http_root
    with pytest.raises(StoreError, match=r"cannot download .*products.zip.*--from-dir"):
        prepare("ogbn-products", mirror=url, data_dir=tmp_path, progress=quiet)
    assert not list((tmp_path / "raw").glob("*.part*"))


def test_bad_zip_is_reported(http_root, tmp_path):
    root, url = http_root
    (root / "ogb").mkdir()
    (root / "ogb" / "arxiv.zip").write_bytes(b"not a zip")
    with pytest.raises(StoreError, match="not a valid zip"):
        prepare("ogbn-arxiv", mirror=url, data_dir=tmp_path, progress=quiet)


def test_dead_server_times_out(tmp_path, monkeypatch):
    """A server that accepts connections but never answers: the download gives up quickly."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(5)
    monkeypatch.setenv("NTP_DOWNLOAD_TIMEOUT", "1")
    start = time.monotonic()
    try:
        with pytest.raises(StoreError, match="cannot download"):
            prepare("ogbn-arxiv", mirror=f"http://127.0.0.1:{sock.getsockname()[1]}", data_dir=tmp_path, progress=quiet)
    finally:
        sock.close()
    assert time.monotonic() - start < 10


def test_refused_connection(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(StoreError, match="cannot download"):
        prepare("ogbn-arxiv", mirror=f"http://127.0.0.1:{port}", data_dir=tmp_path, progress=quiet)


def test_count_mismatch_is_reported(shared_datasets, tmp_path):
    folder = tmp_path / "cora"
    shutil.copytree(shared_datasets / "ogb-layout" / "cora", folder)
    import gzip

    with gzip.open(folder / "raw" / "num-edge-list.csv.gz", "wt") as f:
        f.write("10557\n")
    with pytest.raises(StoreError, match="10556 edges but the dataset says 10557"):
        prepare("cora", from_dir=folder, data_dir=tmp_path, progress=quiet)
    assert not (tmp_path / "stores").exists() or not any(
        p.name.startswith("cora") for p in (tmp_path / "stores").iterdir()
    )


def test_heterogeneous_dataset_downloads_its_own_zip(http_root, tmp_path):
    """ogbn-mag goes through the same download as the homogeneous datasets, under OGB's file name for it."""
    _, url = http_root
    with pytest.raises(StoreError, match=r"cannot download .*/mag.zip.*--from-dir"):
        prepare("ogbn-mag", mirror=url, data_dir=tmp_path, progress=quiet)


def stalling_server(stop: threading.Event) -> socket.socket:
    """A server that sends 2 MiB of a 10 MB file, then stalls until `stop` is set."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(5)

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n" + b"\0" * (2 << 20))
        stop.wait(60)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock


def test_killed_download_leaves_nothing_behind(http_root, shared_datasets, tmp_path):
    stop = threading.Event()
    sock = stalling_server(stop)
    data, raw = tmp_path / "data", tmp_path / "data" / "raw"
    code = "import sys; from storage import prepare; prepare('ogbn-arxiv', mirror=sys.argv[1], data_dir=sys.argv[2])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, f"http://127.0.0.1:{sock.getsockname()[1]}", str(data)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not [p for p in raw.glob("arxiv.zip.part-*") if p.stat().st_size] and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        stop.set()
        sock.close()
    assert list(raw.glob("arxiv.zip.part-*")), "the killed download should have left its partial file"
    root, url = http_root
    make_ogb_zip(shared_datasets / "ogb-layout" / "cora", root / "ogb", "arxiv", "time")
    open_store(prepare("ogbn-arxiv", mirror=url, data_dir=data, progress=quiet))
    assert sorted(p.name for p in raw.iterdir()) == [".arxiv.zip.lock", "arxiv", "arxiv.zip"]
