"""Fixtures for the storage tests."""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ holds no packages: make store_helpers importable

from store_helpers import REPO, SMALL_CHUNKS, quiet  # noqa: E402

from storage import prepare  # noqa: E402
from storage.inputs import CACHE_ENV  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def digest_cache(tmp_path_factory: pytest.TempPathFactory):
    """Keep the input-digest cache of storage.inputs out of the user's home (subprocesses inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("digest-cache")))
        yield


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """../shared/datasets next to the repository; skip if it is not there."""
    path = REPO.parent / "shared" / "datasets"
    if not (path / "ogb-layout").is_dir() or not (path / "planetoid").is_dir():
        pytest.skip(f"shared test data not found at {path} (expected ogb-layout/ and planetoid/)")
    return path


@pytest.fixture(scope="session")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic store with several chunks per array (do not modify: copy it)."""
    out = tmp_path_factory.mktemp("small") / "store"
    prepare("synthetic", nodes=1000, avg_degree=6, features=20, classes=4, out=out, progress=quiet, layout=SMALL_CHUNKS)
    return out


@pytest.fixture
def store_copy(small_store: Path, tmp_path: Path) -> Path:
    """A private copy of the small store that a test may damage."""
    dest = tmp_path / "store"
    shutil.copytree(small_store, dest)
    return dest


@pytest.fixture
def http_root(tmp_path: Path):
    """A local HTTP server on 127.0.0.1 serving tmp_path/www: yields (that folder, base URL of www/ogb)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/ogb"
    server.shutdown()
    server.server_close()
