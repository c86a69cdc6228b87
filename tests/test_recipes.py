"""Every recipe (recipes/*.yaml) is a valid training config whose recipe block names an existing input under
../shared/datasets, a target and its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntp.config import TrainConfig
from ntp.options import load_config_file

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT.parent / "shared" / "datasets"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_recipes_are_configs_with_a_target_and_an_input() -> None:
    assert len(RECIPES) >= 10
    for path in RECIPES:
        cfg = TrainConfig.from_file(path, store="s")
        recipe = load_config_file(path)["recipe"]
        assert recipe["source"] and "target" in recipe, path.name
        assert cfg.splits == "all" or cfg.seeds >= 10, f"{path.name}: ten splits or seeds, as the literature"
        how = recipe["prepare"]
        inputs = [DATASETS / how[k] for k in ("from_dir", "from_npz") if k in how]
        if DATASETS.is_dir():
            assert inputs and all(p.exists() for p in inputs), path.name


def test_a_recipe_block_is_ignored_but_other_unknown_keys_are_not() -> None:
    from ntp.errors import ConfigError

    assert TrainConfig.from_dict({"recipe": {"target": 1}, "gnn": {"model": "rgcn"}}).arch == "coupled"
    with pytest.raises(ConfigError, match="unknown configuration keys"):
        TrainConfig.from_dict({"recipes": {}})
