"""Every recipe (recipes/*.yaml) is a valid training config whose recipe block names an existing input under
../shared/datasets, the options of `ntp data prepare`, a target and its source; every tuning space
(recipes/sweeps/*.yaml) is a valid `ntp sweep` space."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from ntp.config import TrainConfig
from ntp.options import load_config_file
from ntp.run.sweep.space import load_space
from storage.prepare import prepare

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
        inspect.signature(prepare).bind(how["name"], **{k: v for k, v in how.items() if k != "name"})
        inputs = [DATASETS / how[k] for k in ("from_dir", "from_npz") if k in how]
        if DATASETS.is_dir():
            assert inputs and all(p.exists() for p in inputs), path.name


def test_tuning_spaces_are_sweep_spaces() -> None:
    spaces = sorted((ROOT / "recipes" / "sweeps").glob("*.yaml"))
    assert spaces
    for path in spaces:
        assert load_space(path).dimensions, path.name


def test_a_recipe_block_is_ignored_but_other_unknown_keys_are_not() -> None:
    from ntp.errors import ConfigError

    assert TrainConfig.from_dict({"recipe": {"target": 1}, "gnn": {"model": "rgcn"}}).arch == "coupled"
    with pytest.raises(ConfigError, match="unknown configuration keys"):
        TrainConfig.from_dict({"recipes": {}})
