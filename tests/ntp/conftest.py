"""Fixtures for the engine tests: a real Cora store built from ../shared/datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORA_OGB = REPO.parent / "shared" / "datasets" / "ogb-layout" / "cora"


@pytest.fixture(scope="session")
def cora_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not CORA_OGB.is_dir():
        pytest.skip(f"shared test data not found at {CORA_OGB}")
    from storage import prepare

    return str(
        prepare("cora", from_dir=CORA_OGB, out=tmp_path_factory.mktemp("stores") / "cora", progress=lambda s: None)
    )
