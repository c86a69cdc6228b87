"""One style for the whole tree: ruff's formatter and linter (settings in pyproject.toml) find nothing to change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (pip install -e '.[test]' brings it)")
@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_finds_nothing(command: list[str]) -> None:
    done = subprocess.run([RUFF, *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        f"ruff {' '.join(command)} (fix: ruff format . && ruff check --fix .):\n"
        f"{done.stdout[-4000:]}{done.stderr[-2000:]}"
    )
