"""bench/recipes.py: a recipe's runs print one line as each starts and ends (its metric and the running mean), not
their epochs, so an hours-long recipe shows where it is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

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


def test_the_figure_reads_every_judged_row_of_the_recipes_table(tmp_path, monkeypatch) -> None:
    """bench/plots.py draws docs/recipes.md's table: one point per recipe file, at the file's own target."""
    import plots

    rows = plots._recipe_rows()
    targets = {p.stem: yaml.safe_load(p.read_text())["recipe"]["target"] for p in recipes.RECIPES.glob("*.yaml")}
    assert sorted(r["recipe"] for r in rows) == sorted(targets)
    assert all(r["target"] == round(100 * targets[r["recipe"]], 2) for r in rows), "the table quotes each file's target"
    assert all(0 < r["target"] <= 100 and 0 < r["ours"] <= 100 and r["std"] >= 0 for r in rows)
    monkeypatch.setattr(plots, "DOCS", tmp_path)
    (tmp_path / "recipes.md").write_text((plots.REPO / "docs" / "recipes.md").read_text())
    plots.recipes()
    assert (tmp_path / "bench_recipes.png").stat().st_size > 10_000


def test_a_resumed_run_says_so_and_epoch_lines_stay_out(capsys) -> None:
    resumed = "resuming from data/checkpoints/RUN/split0-seed3/ckpt-000039.pt: 40 of 200 epochs done"
    recipes._progress("ddi", f"[ntp] {resumed}")
    recipes._progress("ddi", "epoch  41/200  loss 0.2000")
    assert capsys.readouterr().out == f"ddi: {resumed}\n"
