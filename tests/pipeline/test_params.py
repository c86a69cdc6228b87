"""Flow parameters, the `ntp pipeline` command line, prefect.yaml and import hygiene (no Prefect engine)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys

import pytest
import yaml

from flows.params import DatasetOptions, LaunchOptions, PipelineParams, TrainingOptions, launch_spec
from ntp.config import REPEAT_OPTIONS, ConfigError, TrainConfig
from storage import prepare
from tests.pipeline.conftest import PROJECT


def test_training_options_mirror_train_config() -> None:
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in ("store", *REPEAT_OPTIONS)]
    assert list(TrainingOptions.model_fields) == names
    defaults = TrainConfig()
    for name, field in TrainingOptions.model_fields.items():
        assert field.description, name
        assert field.default == getattr(defaults, name), name


def test_dataset_options_mirror_prepare() -> None:
    """Every option of `storage.prepare` (but the library hooks) is a form field, with prepare's default."""
    params = inspect.signature(prepare).parameters
    options = {n: p.default for n, p in params.items() if n not in ("name", "progress", "layout")}
    assert set(DatasetOptions.model_fields) == {"name", *options}
    for name, default in options.items():
        assert DatasetOptions.model_fields[name].default == default, name


def test_launch_spec_resolves_mode_and_refuses_contradictions() -> None:
    cpu = LaunchOptions(device="cpu")
    assert launch_spec(TrainingOptions(), cpu.model_copy(update={"nproc": 2}), store="s").mode == "tp"
    assert launch_spec(TrainingOptions(), cpu.model_copy(update={"nproc": 1}), store="s").mode == "single"
    assert launch_spec(TrainingOptions(mode="single"), cpu, store="s").nproc_per_node == 1
    with pytest.raises(ConfigError, match="--mode single runs one process"):
        launch_spec(TrainingOptions(mode="single"), cpu.model_copy(update={"nproc": 4}), store="s")
    with pytest.raises(ConfigError):
        launch_spec(TrainingOptions(model="sgc", arch="coupled"), cpu, store="s")


def test_pipeline_schema_is_a_typed_form() -> None:
    schema = PipelineParams.model_json_schema()
    defs = schema["$defs"]
    assert schema["required"] == ["dataset"]
    assert defs["TrainingOptions"]["properties"]["model"]["enum"] == [
        "gcn",
        "sgc",
        "appnp",
        "sage",
        "gin",
        "gat",
        "rgcn",
    ]
    assert defs["TrainingOptions"]["properties"]["epochs"]["default"] == 100
    assert all(p.get("description") for d in defs.values() for p in d["properties"].values())
    with pytest.raises(ValueError):
        PipelineParams(dataset={"name": "x", "bogus": 1})


def test_form_hides_test_hooks_but_runs_accept_them() -> None:
    """fail_at_epoch/fail_rank are not form fields (Prefect renders `properties`), yet a deployment run's parameters
    may set them: the server validates against the same schema, which lists them under `patternProperties`."""
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from flows.pipeline import pipeline
    from flows.train import train

    for flow in (pipeline, train):
        schema = flow.parameters.model_dump_for_openapi()
        form = schema["definitions"]["TrainingOptions"]
        assert not {"fail_at_epoch", "fail_rank"} & set(form["properties"]), flow.name
        assert "epochs" in form["properties"] and form["additionalProperties"] is False
    schema = pipeline.parameters.model_dump_for_openapi()
    validate(
        {"params": {"dataset": {"name": "cora"}, "training": {"fail_rank": 1, "fail_at_epoch": 2}}},
        schema,
        raise_on_error=True,
    )
    for bad in ({"fail_rank": "one"}, {"bogus": 1}):
        with pytest.raises(ValidationError, match="fail_rank|bogus"):
            validate({"params": {"dataset": {"name": "cora"}, "training": bad}}, schema, raise_on_error=True)
    assert TrainingOptions(fail_rank=1, fail_at_epoch=2).model_dump()["fail_rank"] == 1


def test_pipeline_command_line_to_params() -> None:
    from flows.pipeline_cli import add_pipeline_command, params_from_args

    parser = argparse.ArgumentParser()
    add_pipeline_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "pipeline",
            "synthetic",
            "--nodes",
            "500",
            "--data-seed",
            "3",
            "--symmetrize",
            "--epochs",
            "5",
            "--seed",
            "7",
            "--model",
            "sage",
            "--nproc",
            "2",
            "--retries",
            "1",
            "--job-timeout",
            "60",
            "--experiment",
            "exp",
        ]
    )
    p = params_from_args(args)
    assert p.dataset == DatasetOptions(name="synthetic", nodes=500, seed=3, symmetrize=True)
    assert (p.training.epochs, p.training.seed, p.training.model, p.training.mode) == (5, 7, "sage", None)
    assert (p.launch.nproc, p.launch.retries, p.launch.job_timeout_s, p.experiment) == (2, 1, 60.0, "exp")
    assert args.func.__name__ == "run_pipeline_cli"
    with pytest.raises(SystemExit):  # the pipeline builds its own store: --store is not one of its options
        parser.parse_args(["pipeline", "cora", "--store", "somewhere"])


def test_packages_do_not_import_prefect_eagerly() -> None:
    code = (
        "import sys, argparse, flows, flows.pipeline_cli, ntp.run.tracking, ntp.run.compare;"
        "p = argparse.ArgumentParser(); s = p.add_subparsers();"
        "flows.pipeline_cli.add_pipeline_command(s); ntp.run.compare.add_compare_command(s);"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('prefect', 'mlflow')], 'eager import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PROJECT, timeout=120)


def test_prefect_yaml_deployments() -> None:
    spec = yaml.safe_load((PROJECT / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    assert set(deps) == {"nightly-arxiv", "pipeline", "train", "sweep", "sweep-trial", "predict"}
    for d in deps.values():
        module, func = d["entrypoint"].split(":")
        assert (PROJECT / module).is_file() and func in {"pipeline", "train", "sweep", "sweep_trial", "predict"}
        if d["name"] == "sweep":  # the controller never holds a slot of the pool its trials need
            assert d["work_pool"]["name"] == "control-pool" and "concurrency_limit" not in d
        elif d["name"] == "sweep-trial":  # one flow run per trial: the pool's limit bounds them, not its own
            assert d["work_pool"]["name"] == "gpu-pool" and "concurrency_limit" not in d
        else:
            assert d["work_pool"]["name"] == "gpu-pool" and d["concurrency_limit"]["limit"] == 1
    nightly = deps["nightly-arxiv"]
    assert nightly["schedules"][0]["cron"].split()[:2] == ["0", "2"]
    params = PipelineParams(**nightly["parameters"]["params"])
    assert params.dataset.name == "ogbn-arxiv"
    launch_spec(params.training, params.launch.model_copy(update={"device": "cpu"}), store="s")  # valid options
    trigger = deps["predict"]["triggers"][0]  # the champion's move runs predict with it
    assert trigger["expect"] == ["ntp.champion.moved"] and "model_uri" in trigger["parameters"]
    assert params.registered_model  # the nightly retrain registers a challenger
    assert spec["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]


@pytest.mark.parametrize("command", ["train", "pipeline", "evaluate", "predict", "sweep", "compare"])
def test_help_states_each_default_once(command: str) -> None:
    from ntp.run.cli import build_parser

    sub = build_parser(load_plugin=command)._subparsers._group_actions[0].choices[command]
    text = " ".join(sub.format_help().split())
    assert "(default: None)" not in text and text.count("(default: 100)") <= 1, text
    if command == "train":
        assert "--offload {none,topology,all}" in text and "--nn-device {auto,device,stream,cpu}" in text
