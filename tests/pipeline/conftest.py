"""Pipeline test environment: Prefect, MLflow and the data directory all live in one temporary directory.

The environment is set when this conftest is imported, before any test imports Prefect: a private
PREFECT_HOME, analytics off (offline), no PREFECT_API_URL, sqlite MLflow and NTP_DATA_DIR under the same root.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(tempfile.mkdtemp(prefix="ntp-pipeline-tests-"))
os.environ.update({
    "PREFECT_HOME": str(ROOT / "prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.3",
    "MLFLOW_TRACKING_URI": f"sqlite:///{ROOT / 'mlflow.db'}",
    "NTP_DATA_DIR": str(ROOT / "data"),
})
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("PREFECT_PROFILE", None)

PROJECT = Path(__file__).resolve().parents[2]
CORA = PROJECT.parent / "shared" / "datasets" / "ogb-layout" / "cora"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(ROOT, ignore_errors=True)


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
