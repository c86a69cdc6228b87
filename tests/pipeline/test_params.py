"""Flow parameters, the `ntp pipeline` command line, prefect.yaml and import hygiene (no Prefect engine)."""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest
import yaml

from flows.params import DatasetOptions, LaunchOptions, PipelineParams, TrainingOptions, train_config
from ntp.config import ConfigError, TrainConfig
from tests.pipeline.conftest import PROJECT


def test_training_options_mirror_train_config() -> None:
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "store"]
    assert list(TrainingOptions.model_fields) == names
    defaults = TrainConfig()
    for name, field in TrainingOptions.model_fields.items():
        assert field.description, name
        if name != "mode":
            assert field.default == getattr(defaults, name), name


def test_train_config_resolves_mode() -> None:
    assert train_config(TrainingOptions(), store="s", nproc=2).mode == "tp"
    assert train_config(TrainingOptions(), store="s", nproc=1).mode == "single"
    assert train_config(TrainingOptions(mode="single"), store="s", nproc=4).mode == "single"
    with pytest.raises(ConfigError):
        train_config(TrainingOptions(model="sgc", arch="coupled"), store="s", nproc=1)


def test_pipeline_schema_is_a_typed_form() -> None:
    schema = PipelineParams.model_json_schema()
    defs = schema["$defs"]
    assert schema["required"] == ["dataset"]
    assert defs["TrainingOptions"]["properties"]["model"]["enum"] == ["gcn", "sgc", "appnp", "sage", "gin", "gat"]
    assert defs["TrainingOptions"]["properties"]["epochs"]["default"] == 100
    assert all(p.get("description") for d in defs.values() for p in d["properties"].values())
    with pytest.raises(ValueError):
        PipelineParams(dataset={"name": "x", "bogus": 1})


def test_launch_options_default_nproc() -> None:
    assert LaunchOptions().resolved_nproc() >= 1
    assert LaunchOptions(nproc=3).resolved_nproc() == 3


def test_pipeline_command_line_to_params() -> None:
    from flows.pipeline_cli import add_pipeline_command, params_from_args

    parser = argparse.ArgumentParser()
    add_pipeline_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["pipeline", "synthetic", "--nodes", "500", "--data-seed", "3", "--symmetrize",
                              "--epochs", "5", "--seed", "7", "--model", "sage", "--nproc", "2", "--retries", "1",
                              "--job-timeout", "60", "--experiment", "exp"])
    p = params_from_args(args)
    assert p.dataset == DatasetOptions(name="synthetic", nodes=500, seed=3, symmetrize=True)
    assert (p.training.epochs, p.training.seed, p.training.model, p.training.mode) == (5, 7, "sage", None)
    assert (p.launch.nproc, p.launch.retries, p.launch.timeout_s, p.experiment) == (2, 1, 60.0, "exp")
    assert args.func.__name__ == "run_pipeline_cli"
    bad = parser.parse_args(["pipeline", "cora", "--store", "somewhere"])
    assert args.func(bad) == 2


def test_packages_do_not_import_prefect_eagerly() -> None:
    code = ("import sys, argparse, flows, flows.pipeline_cli, ntp.tracking, ntp.compare;"
            "p = argparse.ArgumentParser(); s = p.add_subparsers();"
            "flows.pipeline_cli.add_pipeline_command(s); ntp.compare.add_compare_command(s);"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('prefect', 'mlflow')], 'eager import'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PROJECT, timeout=120)


def test_prefect_yaml_deployments() -> None:
    spec = yaml.safe_load((PROJECT / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    assert set(deps) == {"nightly-arxiv", "pipeline", "train"}
    for d in deps.values():
        assert d["work_pool"]["name"] == "gpu-pool"
        assert d["concurrency_limit"]["limit"] == 1
        module, func = d["entrypoint"].split(":")
        assert (PROJECT / module).is_file() and func in {"pipeline", "train"}
    nightly = deps["nightly-arxiv"]
    assert nightly["schedules"][0]["cron"].split()[:2] == ["0", "2"]
    params = PipelineParams(**nightly["parameters"]["params"])
    assert params.dataset.name == "ogbn-arxiv"
    train_config(params.training, store="s", nproc=8)  # valid training options
    assert spec["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]


@pytest.mark.parametrize("command", ["train", "pipeline", "evaluate", "compare"])
def test_help_states_each_default_once(command: str) -> None:
    from flows.cli import build_parser

    sub = build_parser(with_pipeline=True)._subparsers._group_actions[0].choices[command]
    text = " ".join(sub.format_help().split())
    assert "(default: None)" not in text and text.count("(default: 100)") <= 1, text
    if command == "train":
        assert "--offload {none,topology,all}" in text and "--nn-device {auto,device,cpu}" in text
