"""The config: models as specs (the checks follow each model's capabilities, and no module compares model names),
sections (grouped files, --help by section, hidden test hooks) and old saved configs still loading."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import get_args

import pytest

from ntp.config import SECTIONS, TrainConfig, section_of
from ntp.errors import ConfigError
from ntp.model_specs import MODELS
from ntp.options import Model
from ntp.run.flags import add_config_arguments, config_from_args

ROOT = Path(__file__).resolve().parents[1]


def test_the_registry_is_the_list_of_models() -> None:
    assert set(get_args(Model)) == set(MODELS)
    assert all(spec.name == name for name, spec in MODELS.items())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_models_checks_follow_its_capabilities(name: str) -> None:
    spec = MODELS[name]
    for arch in ("decoupled", "coupled"):
        if arch in spec.archs:
            TrainConfig(model=name, arch=arch)
        else:
            with pytest.raises(ConfigError, match=f"--model {name} is .* by nature; use --arch {spec.archs[0]}"):
                TrainConfig(model=name, arch=arch)
    arch = spec.archs[0]
    refused = {
        "offload": spec.attention or spec.heterogeneous,
        "overlap": spec.attention or spec.heterogeneous,
        "stream": not spec.row_wise,
        "data": spec.heterogeneous,
    }
    options = {
        "offload": dict(offload="topology", mode="tp"),
        "overlap": dict(overlap=True, mode="tp"),
        "stream": dict(nn_device="stream"),
        "data": dict(mode="data"),
    }
    for what, kw in options.items():
        if refused[what]:
            with pytest.raises(ConfigError):
                TrainConfig(model=name, arch=arch, **kw)
        else:
            TrainConfig(model=name, arch=arch, **kw)
    assert TrainConfig(model=name, arch=arch).nn_streams == spec.row_wise


def _model_name_comparisons(path: Path) -> list[str]:
    """``x.model == "gat"``, ``cfg.model in ("gat", ...)`` and the like in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)} & set(MODELS)
        if names and any(isinstance(s, ast.Attribute) and s.attr == "model" for s in sides):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_compares_model_names(tmp_path: Path) -> None:
    """Capabilities live in ntp/model_specs.py; code asks them (cfg.model_spec.attention), not the name."""
    offenders = {
        str(p.relative_to(ROOT)): c for p in sorted((ROOT / "ntp").rglob("*.py")) if (c := _model_name_comparisons(p))
    }
    assert not offenders, f"model names compared outside the registry: {offenders}"
    sample = tmp_path / "sample.py"
    sample.write_text('if cfg.model in ("gat", "rgcn") or self.model == "sgc":\n    pass\n')
    assert len(_model_name_comparisons(sample)) == 2, "the scan must see name comparisons"


def test_every_option_has_a_section_and_grouped_files_read_as_flat(tmp_path: Path) -> None:
    assert all(section_of(name) in SECTIONS for name in TrainConfig.__dataclass_fields__)
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text("gnn: {model: sage, hidden: 32}\noptim: {lr: 0.02}\nlink: {decoder: dot}\nepochs: 7\n")
    flat = dict(model="sage", hidden=32, lr=0.02, decoder="dot", epochs=7)
    assert TrainConfig.from_file(grouped) == TrainConfig(**flat)
    assert TrainConfig(**flat).section("link") == {
        "decoder": "dot",
        "decoder_layers": 2,
        "link_batch": 65536,
        "clip_grad": 0.0,
    }
    assert TrainConfig(**flat).changed("link") == ["decoder"]
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("link: {hidden: 32}\n")
    with pytest.raises(ConfigError, match="'hidden' is in section 'link'; it belongs to section 'gnn'"):
        TrainConfig.from_file(wrong)


def test_saved_configs_of_older_versions_still_load() -> None:
    saved = {**TrainConfig(epochs=3).to_dict(), "pipeline": True, "timeout_s": 60.0, "offload": False, "mode": "tp"}
    del saved["overlap"], saved["collective_timeout_s"]
    cfg = TrainConfig.from_dict(saved)
    assert cfg.overlap and cfg.collective_timeout_s == 60.0 and cfg.offload == "none"


def test_help_groups_options_by_section_and_hides_the_test_hooks(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="ntp train")
    add_config_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    titles = [SECTIONS[s] for s in SECTIONS if s != "testing"]
    assert [text.index(f"\n{t}:") for t in titles] == sorted(text.index(f"\n{t}:") for t in titles)
    assert "--fail-rank" not in text and "--fail-at-epoch" not in text
    cfg = config_from_args(parser.parse_args(["--fail-rank", "1", "--fail-at-epoch", "2"]))
    assert (cfg.fail_rank, cfg.fail_at_epoch) == (1, 2)  # hidden, still taken


def test_a_models_defaults_apply_where_nothing_was_given_and_reach_the_workers() -> None:
    from ntp.run.flags import config_to_argv

    rgcn = TrainConfig.from_dict({"model": "rgcn"})
    assert (rgcn.arch, rgcn.hidden, rgcn.dropout, rgcn.weight_decay, rgcn.epochs) == ("coupled", 16, 0.0, 0.0, 50)
    assert TrainConfig.from_dict({"model": "gcn"}).arch == "decoupled", "gcn keeps the general defaults"
    # a value equal to the general default but not the model's must reach torchrun's workers as a flag
    chosen = TrainConfig.from_dict({"model": "rgcn", "arch": "decoupled", "dropout": 0.5})
    argv = config_to_argv(chosen)
    assert argv == ["--model", "rgcn", "--arch", "decoupled", "--dropout", "0.5"]
    parsed = dict(zip(argv[::2], argv[1::2]))
    again = TrainConfig.from_dict({k[2:].replace("-", "_"): v for k, v in parsed.items()} | {"dropout": 0.5})
    assert again == chosen
