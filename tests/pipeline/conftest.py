"""Pipeline test fixtures (the session's private Prefect/MLflow/data environment is set in tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_ROOT as ROOT

PROJECT = Path(__file__).resolve().parents[2]
CORA = PROJECT.parent / "shared" / "datasets" / "ogb-layout" / "cora"


def quickstart():
    """docs/quickstart.py (docs/ is no package), loaded once: the README's Prefect steps and stopping a process tree."""
    if "docs_quickstart" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docs_quickstart", PROJECT / "docs" / "quickstart.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["docs_quickstart"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules["docs_quickstart"]


@pytest.fixture(scope="session")
def test_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One ephemeral Prefect API (temporary database) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture(scope="session")
def cora_store() -> str:
    """The Cora store, built through the prepare task's body (``.fn()``, no Prefect engine)."""
    if not CORA.is_dir():
        pytest.skip(f"{CORA} is missing (shared datasets)")
    from prefect.logging import disable_run_logger

    from tasks.prepare import prepare_store

    with disable_run_logger():
        return prepare_store.fn("cora", {"from_dir": str(CORA)})
