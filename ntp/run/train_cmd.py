"""``ntp train``: train on a store, as a torchrun job (several processes) or in this process (one), tracked in
MLflow unless ``--no-track``."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
from dataclasses import fields

from ntp.run.flags import add_config_arguments, add_launch_arguments, spec_from_args


def add_train_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="train a GNN on a graph store (tensor parallel with several processes)",
        description="Train a GNN on a graph store. With several processes this launches "
        "`torchrun --nproc-per-node M -m ntp.run.worker` (gloo on CPU, NCCL on GPUs, one GPU per rank); "
        "one process trains in this one. Every epoch prints a line (loss, metrics, time, ETA); the run "
        "is logged to MLflow as it trains (default: sqlite under the data directory, or "
        "$MLFLOW_TRACKING_URI). Example: ntp train --store data/stores/cora-... --nproc 2 --model gcn "
        "--epochs 200",
    )
    launch = parser.add_argument_group("launch")
    add_launch_arguments(launch)
    launch.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve the launch, check the store, outputs and memory plan, print them and the "
        "torchrun command, and exit without training",
    )
    tracking = parser.add_argument_group("tracking")
    tracking.add_argument("--no-track", action="store_true", help="do not log the run to MLflow")
    tracking.add_argument("--experiment", default=None, help="MLflow experiment (default: the dataset's name)")
    tracking.add_argument("--run-name", default=None, help="MLflow run name (default: model-arch-mode-ranks-date)")
    tracking.add_argument(
        "--register",
        default=None,
        metavar="NAME",
        help="register the best model (logged as an MLflow model: node ids -> predictions) as a "
        "new version of NAME in the MLflow model registry",
    )
    tracking.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra tag of the MLflow run (repeatable); --tag mlflow.parentRunId=RUN_ID makes it a child run",
    )
    tracking.add_argument(
        "--continue",
        dest="continue_run",
        default=None,
        metavar="RUN_ID",
        help="with --splits/--seeds: take up that stopped parent run (killed, failed, preempted) with the same "
        "options; its finished runs are kept, the others train under it",
    )
    add_config_arguments(parser)
    parser.set_defaults(func=run_train)
    return parser


def run_train(args: argparse.Namespace) -> int:
    """Exit codes: 0 trained, 1 the job failed, 2 bad input (nothing ran), 130/143 interrupted (Ctrl-C/SIGTERM)."""
    from ntp.errors import Terminated
    from ntp.run.processes import exit_code, sigterm_raises

    try:
        if args.dry_run:
            return dry_run(args)
        with sigterm_raises():
            result = _train(args)
    except (Exception, KeyboardInterrupt, Terminated) as exc:
        return exit_code(exc, "" if args.no_track else " and its MLflow run is KILLED")
    _print_outcome(result)
    return 0


def _check_tracking(args: argparse.Namespace) -> None:
    from ntp.errors import ConfigError

    if args.no_track and getattr(args, "register", None):
        raise ConfigError("--register logs the model to MLflow, which --no-track turns off: drop one of them")
    if not args.no_track and importlib.util.find_spec("mlflow") is None:
        raise ConfigError(
            "MLflow is not installed here, so the run cannot be tracked: install the tracking extra "
            "(pip install 'ntp[tracking]') or pass --no-track"
        )
    if not args.no_track:
        from ntp.run.tracking.mlflow_store import check_server

        check_server()


def parse_tags(items: list[str]) -> dict[str, str]:
    """``--tag KEY=VALUE`` flags as a dict (ConfigError for one without ``=``)."""
    from ntp.errors import ConfigError

    tags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--tag {item!r}: write it as KEY=VALUE")
        tags[key] = value
    return tags


def _train(args: argparse.Namespace):
    from ntp.run.progress import ProgressBar
    from ntp.run.repeats import repeated, train_repeats
    from ntp.run.tracking import train_tracked, train_untracked

    spec = spec_from_args(args)
    print(f"[ntp] {spec.describe()}", flush=True)
    _check_tracking(args)
    if repeated(spec.config):
        if args.register:
            from ntp.errors import ConfigError

            raise ConfigError("--register names one model; --splits/--seeds train several: register one run's model")
        return train_repeats(
            spec,
            track=not args.no_track,
            experiment=args.experiment,
            run_name=args.run_name,
            on_line=print,
            continue_run=args.continue_run,
        )
    if args.continue_run:
        from ntp.errors import ConfigError

        raise ConfigError("--continue takes up a --splits/--seeds run: give the --splits/--seeds it was made with")
    # one process trains here and prints its own lines; a bar is for the output streamed from torchrun
    bar = ProgressBar(spec.config.epochs) if ProgressBar.wanted() and spec.mode != "single" else None
    on_line, consumers = (bar.line, [bar]) if bar else (print, [])
    try:
        if args.no_track:
            return train_untracked(spec, on_line=on_line, consumers=consumers)
        return train_tracked(
            spec,
            experiment=args.experiment,
            run_name=args.run_name,
            on_line=on_line,
            consumers=consumers,
            register=args.register,
            tags=parse_tags(args.tag),
        )
    finally:
        if bar:
            bar.close()


def dry_run(args: argparse.Namespace) -> int:
    """``--dry-run``: the resolved launch, the preflight checks and the command that would run; nothing starts."""
    from ntp.run.launch import torchrun_command
    from ntp.run.preflight import check_launch

    spec = spec_from_args(args)
    _check_tracking(args)
    plan = check_launch(spec)
    cfg = spec.config
    print("[ntp] dry run: the launch is resolved and checked; nothing was started")
    print(f"launch    {spec.describe()}" + (f", job timeout {spec.job_timeout_s:g} s" if spec.job_timeout_s else ""))
    print(f"store     {cfg.store}")
    print("model     " + ", ".join(f"{name} {getattr(cfg, name)}" for name in KEY_FIELDS))
    print(f"options   {_changed_options(cfg)}")
    print(f"memory    {_describe_plan(spec, plan)}")
    print(
        "tracking  "
        + (
            "off (--no-track)"
            if args.no_track
            else f"MLflow, experiment {args.experiment or 'named after the dataset'}"
        )
    )
    if spec.mode == "single":
        print("command   none: --mode single trains in this process (no torchrun)")
    else:
        print(f"command   {shlex.join(torchrun_command(spec))}")
        print("          (run with --log-dir and TORCHELASTIC_ERROR_FILE in a temporary folder removed at the end)")
    return 0


#: The fields a dry run always shows; the others only when they differ from the defaults.
KEY_FIELDS = ("model", "arch", "epochs", "hidden", "nn_layers", "prop_steps", "lr")


def _changed_options(cfg) -> str:
    """The other options that differ from their defaults, as flags (the mode is in the launch line)."""
    changed = {
        f.name: getattr(cfg, f.name)
        for f in fields(cfg)
        if f.name not in ("store", "mode", *KEY_FIELDS) and getattr(cfg, f.name) != cfg.default_of(f.name)
    }
    return (
        " ".join(
            f"--{name.replace('_', '-')}" + ("" if value is True else f" {value}") for name, value in changed.items()
        )
        or "the defaults"
    )


def _describe_plan(spec, plan) -> str:
    """The chunk plan of the preflight check, and how it was chosen."""
    cfg = spec.config
    if plan is not None:
        source = "--chunk-rows" if cfg.chunk_rows else "--memory-budget and the store's degrees"
        largest = max(b - a for a, b in plan.ranges())
        return (
            f"{plan.num_chunks} chunk(s) of destination rows over {plan.num_nodes:,} vertices, largest "
            f"{largest:,} rows ({plan.reason}; from {source})"
        )
    if spec.mode == "data":
        return "one block per rank (--mode data does not chunk aggregation)"
    if spec.device == "cuda":
        return "chosen by each rank from its free GPU memory (80% of what is free beside the resident tensors)"
    return "one chunk: no --memory-budget or --chunk-rows, and the CPU has no default budget"


def _print_outcome(result) -> None:
    if hasattr(result, "lines"):  # --splits/--seeds: ntp.run.repeats.RepeatSummary
        print("\n".join(result.lines()))
        return
    final = result.final
    if final is not None and final.test_metric is not None:
        print(f"test {final.metric}: {final.test_metric:.4f} at {final.kept_at()}")
    if result.results_path:
        print(f"results: {result.results_path}")
    if result.model_path:
        print(f"model: {result.model_path}")
    if result.run_id and result.tracking_lost:
        print(f"mlflow run: {result.run_id} (incomplete: its tracking server stopped answering during the job)")
    elif result.run_id:
        from ntp.run.tracking import run_url

        print(f"mlflow run: {result.run_id}  ({run_url(result.run_id)})")
