"""`ntp pipeline NAME [options]`: run the pipeline flow locally (ephemeral Prefect, no server needed).

This module imports no Prefect at import time: the console script registers the command cheaply.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
import typing
from typing import Any, get_args, get_origin

from ntp.config import REPEAT_OPTIONS
from ntp.run.flags import add_config_arguments, add_launch_arguments, config_from_args

#: DatasetOptions fields whose flag differs from the field name (TrainConfig already owns --seed).
_RENAMED = {"seed": "data-seed"}


def _flag(name: str) -> str:
    return "--" + _RENAMED.get(name, name.replace("_", "-"))


def _base_type(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def add_dataset_arguments(parser: Any) -> None:
    """NAME and the `ntp data prepare` options, generated from ``flows.params.DatasetOptions``."""
    from flows.params import DatasetOptions

    parser.add_argument("name", metavar="NAME", help=DatasetOptions.model_fields["name"].description)
    for name, f in DatasetOptions.model_fields.items():
        if name == "name":
            continue
        base = _base_type(f.annotation)
        said = f.default is None or "default" in (f.description or "")  # the description says it, or there is none
        help_text = f.description if said else f"{f.description} (default: {f.default})"
        dest = f"data_{name}"
        if base is bool:
            parser.add_argument(_flag(name), dest=dest, action="store_true", help=help_text)
        elif get_origin(base) is typing.Literal:
            parser.add_argument(_flag(name), dest=dest, choices=get_args(base), default=f.default, help=help_text)
        else:
            parser.add_argument(
                _flag(name),
                dest=dest,
                type=base,
                default=f.default,
                help=help_text,
                metavar=_RENAMED.get(name, name).replace("-", "_").upper(),
            )


def add_pipeline_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `pipeline` on an argparse subparsers object (``func`` returns the exit code)."""
    p = subparsers.add_parser(
        "pipeline",
        help="prepare -> train -> evaluate as a Prefect flow, tracked in MLflow",
        description="Run the pipeline flow locally: build (or reuse) the store, train with torchrun, evaluate the "
        "best model; MLflow holds the run (default: sqlite under the data directory, or "
        "$MLFLOW_TRACKING_URI). Uses $PREFECT_API_URL when set, else an ephemeral Prefect.",
    )
    add_dataset_arguments(p.add_argument_group("dataset (as `ntp data prepare`)"))
    add_config_arguments(p, exclude=("store", *REPEAT_OPTIONS), title="training (as `ntp train`): ")
    launch = p.add_argument_group("launch (as `ntp train`)")
    add_launch_arguments(launch)
    launch.add_argument("--retries", type=int, default=0, help="retry a failed training job N times (default 0)")
    launch.add_argument("--retry-delay", type=float, default=10.0, help="seconds between retries (default 10)")
    p.add_argument("--experiment", default=None, help="MLflow experiment (default: the dataset's name)")
    p.add_argument(
        "--register",
        default=None,
        metavar="NAME",
        help="register the best model as a new version of NAME in the MLflow model registry (alias challenger; "
        "champion if it beats the champion)",
    )
    p.add_argument(
        "--champion-margin",
        type=float,
        default=0.0,
        help="with --register: the champion alias moves only if the new model beats it by more than this (default: 0)",
    )
    p.add_argument(
        "--embeddings-out",
        default=None,
        metavar="DIR",
        help="publish the best model's node embeddings there (a Parquet dataset, replaced)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved flow parameters (YAML, as a "
        "deployment takes them) and the launch, and exit without running the flow",
    )
    p.set_defaults(func=run_pipeline_cli)
    return p


def params_from_args(args: argparse.Namespace) -> Any:
    """The ``PipelineParams`` of parsed `ntp pipeline` arguments."""
    from flows.params import DatasetOptions, LaunchOptions, PipelineParams, TrainingOptions

    cfg = config_from_args(args).to_dict()
    cfg.pop("store")
    repeats = {name: cfg.pop(name) for name in REPEAT_OPTIONS}
    if any(repeats.values()):  # only from a --config file: the flags are not offered
        raise SystemExit(f"error: the pipeline trains one job; {repeats} run from `ntp train`: drop them from --config")
    dataset = {name: getattr(args, f"data_{name}") for name in DatasetOptions.model_fields if name != "name"}
    return PipelineParams(
        dataset=DatasetOptions(name=args.name, **dataset),
        training=TrainingOptions(**cfg),
        launch=LaunchOptions(
            nproc=args.nproc,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            interface=args.interface,
            job_id=args.job_id,
            rdzv_endpoint=args.rdzv_endpoint,
            device=args.device,
            job_timeout_s=args.job_timeout,
            retries=args.retries,
            retry_delay_s=args.retry_delay,
        ),
        experiment=args.experiment,
        registered_model=args.register,
        champion_margin=args.champion_margin,
        embeddings_out=args.embeddings_out,
    )


def run_pipeline_cli(args: argparse.Namespace) -> int:
    """Run the pipeline flow in this process; print the store, MLflow run and metrics. Exit codes: 0 done, 1 a step
    failed, 2 bad input, 130/143 interrupted (Ctrl-C/SIGTERM; nothing is left running)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        params = params_from_args(args)
    except (ValueError, TypeError) as exc:  # ConfigError and pydantic's ValidationError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(params)
    from flows.local_server import prefect_api
    from flows.pipeline import pipeline
    from ntp.errors import Terminated
    from ntp.run.processes import sigterm_raises

    try:
        with sigterm_raises(), prefect_api():
            out = pipeline(params)
    except (KeyboardInterrupt, Terminated) as exc:
        reason = str(exc) or "interrupted (Ctrl-C)"
        print(f"stopped: {reason}; the job's processes and the temporary Prefect server are gone", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except Exception as exc:  # the flow run is already marked failed; the message holds the rank's traceback
        print(f"error: pipeline failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"store: {out['store']}")
    if out.get("run_id"):
        from ntp.run.tracking import run_url

        ev = out.get("evaluation") or {}
        print(
            "evaluation: "
            + ", ".join(f"{k} {ev[k]:.4f}" for k in ("train", "valid", "test") if k in ev)
            + (f" ({ev['metric']})" if "metric" in ev else "")
        )
        print(f"mlflow run: {out['run_id']}")
        print(f"mlflow link: {run_url(out['run_id'])}")
        if out.get("embeddings"):
            print(f"embeddings: {out['embeddings']}")
    return 0


def dry_run(params: Any) -> int:
    """The flow's parameters as YAML and the launch they resolve to; no Prefect, nothing built or trained."""
    import yaml

    from flows.params import launch_spec

    try:
        spec = launch_spec(params.training, params.launch, store="(built by the prepare step)")
    except ValueError as exc:  # ConfigError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("[ntp] dry run: the pipeline's parameters are resolved; no flow was run")
    print(yaml.safe_dump({"params": params.model_dump(mode="json")}, sort_keys=False), end="")
    print(f"launch: {spec.describe()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ntp")
    add_pipeline_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
