"""bench/recipes.py: a recipe's runs print one line as each starts and ends (its metric and the running mean), not
their epochs, so an hours-long recipe shows where it is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import recipes  # noqa: E402  (bench/ is not a package)


@pytest.mark.skipif(not (recipes.DATASETS / "ogb-layout").is_dir(), reason="needs ../shared/datasets")
def test_a_recipe_prints_each_run_and_the_running_mean(capsys) -> None:
    row = recipes.run(recipes.RECIPES / "cora-gcn.yaml", nproc=1, track=False, overrides={"epochs": 2, "seeds": 2})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "cora-gcn: run 1/2: split 0, seed 0"
    assert lines[2] == "cora-gcn: run 2/2: split 0, seed 1"
    assert lines[3].startswith("cora-gcn: run 2/2: split 0, seed 1: test acc ")
    assert lines[3].endswith(f"mean of 2 so far {row['ours'] / 100:.4f} +- {row['ours_std'] / 100:.4f}")
    assert len(lines) == 4, "the epochs' lines are left out"
