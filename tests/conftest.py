"""The whole test session runs in a private environment: Prefect, MLflow, the data directory and the input-digest
cache all live in one temporary directory, set before any test imports Prefect (a private PREFECT_HOME, analytics
off because the machine is offline, no PREFECT_API_URL, sqlite MLflow, NTP_DATA_DIR, NTP_CACHE_DIR), so no test
writes into the checkout, the user's home or a user's servers."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

TEST_ROOT = Path(tempfile.mkdtemp(prefix="ntp-tests-"))
os.environ.update(
    {
        "PREFECT_HOME": str(TEST_ROOT / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.3",
        "MLFLOW_TRACKING_URI": f"sqlite:///{TEST_ROOT / 'mlflow.db'}",
        "NTP_DATA_DIR": str(TEST_ROOT / "data"),
        "NTP_CACHE_DIR": str(TEST_ROOT / "cache"),
    }
)
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("PREFECT_PROFILE", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(TEST_ROOT, ignore_errors=True)
