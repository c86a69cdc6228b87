"""``ntp sweep``: a hyperparameter search over any training options (an Optuna study), its trials run as ordinary
tracked ``ntp train`` jobs, ``--parallel`` at a time, under one MLflow parent run; resumable."""

from __future__ import annotations

import argparse

from ntp.run.flags import add_launch_arguments

EXAMPLE = """\
search space (YAML):
  fixed: {epochs: 50}
  space:
    lr: {low: 0.001, high: 0.1, log: true}
    hidden: [64, 128, 256]
    dropout: {low: 0.0, high: 0.7}
    prop_steps: {low: 1, high: 4}

example:
  ntp sweep --store data/stores/ogbn-arxiv-... --space sweep.yaml --trials 40 --parallel 4 --register arxiv-gcn
  (run the same command again to resume it after a crash or Ctrl-C)
"""


def add_sweep_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "sweep",
        help="hyperparameter search: an Optuna study of tracked training jobs",
        description="Search training options with an Optuna study. Each trial is an `ntp train` job tracked as a "
        "child run of one MLflow parent run; its epochs' validation metric is reported as it trains, and the "
        "pruner stops bad trials early. The parent run gets the leaderboard and the study's plots; the best "
        "trial's model is registered with --register (alias challenger; champion if it beats the champion). The "
        "study lives in a database beside MLflow's (or in it, on PostgreSQL), so the same command resumes it.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", required=True, help="the graph store every trial trains on")
    parser.add_argument("--space", required=True, help="YAML file: `space:` (ranges, choices) and `fixed:` options")
    parser.add_argument(
        "--trials", type=int, default=20, help="trials in the study, resumed ones included (default: 20)"
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="training jobs at once on this machine; on GPUs each gets its own share of the visible GPUs (default: 1)",
    )
    parser.add_argument("--sampler", choices=("tpe", "random", "grid"), default="tpe", help="(default: tpe)")
    parser.add_argument(
        "--pruner",
        choices=("median", "hyperband", "none"),
        default="median",
        help="stop trials early from their live validation metric (default: median)",
    )
    parser.add_argument("--seed", type=int, default=None, help="the sampler's seed (default: random)")
    parser.add_argument(
        "--study-name", default=None, help="the Optuna study; the same name resumes it (default: the space file's name)"
    )
    parser.add_argument(
        "--storage",
        default=None,
        help="Optuna storage URL (default: optuna.db beside MLflow's sqlite database; MLflow's own database, schema "
        "optuna, when MLFLOW_TRACKING_URI is PostgreSQL)",
    )
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the dataset's name)")
    parser.add_argument("--register", default=None, metavar="NAME", help="register the best trial's model as NAME")
    parser.add_argument(
        "--margin",
        type=float,
        default=0.0,
        help="with --register: the champion alias moves only if the best beats it by more than this (default: 0)",
    )
    launch = parser.add_argument_group("each trial's launch (as ntp train)")
    add_launch_arguments(launch)
    parser.set_defaults(func=run_sweep_command)
    return parser


def trial_launch_args(args: argparse.Namespace) -> list[str]:
    """The `ntp train` launch flags each trial gets."""
    argv = ["--device", args.device]
    if args.nproc is not None:
        argv += ["--nproc", str(args.nproc)]
    if args.job_timeout is not None:
        argv += ["--job-timeout", str(args.job_timeout)]
    if args.nnodes != 1:
        from ntp.errors import ConfigError

        raise ConfigError("a sweep's trials run on one node each; drop --nnodes")
    return argv


def run_sweep_command(args: argparse.Namespace) -> int:
    """Exit codes: 0 done, 1 a failure, 2 bad input, 130/143 interrupted (run the command again to resume)."""
    from pathlib import Path

    from ntp.errors import Terminated
    from ntp.run.processes import exit_code

    try:
        from ntp.run.sweep.space import load_space
        from ntp.run.sweep.study import SweepSettings
        from ntp.run.sweep.sweep import run_sweep

        settings = SweepSettings(
            space=load_space(args.space),
            store=args.store,
            study_name=args.study_name or Path(args.space).stem,
            n_trials=args.trials,
            parallel=args.parallel,
            sampler=args.sampler,
            pruner=args.pruner,
            seed=args.seed,
            storage=args.storage,
            experiment=args.experiment,
            register=args.register,
            launch_args=trial_launch_args(args),
            device=args.device,
        )
        result = run_sweep(settings, margin=args.margin)
    except (Exception, KeyboardInterrupt, Terminated) as exc:
        return exit_code(exc, "; run the same command again to resume the sweep")
    _print_result(result)
    return 0


def _print_result(result) -> None:
    from ntp.run.tracking import run_url

    print(result.leaderboard.drop(columns=["run_id"]).to_string(index=False, max_rows=20))
    states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(result.counts.items()))
    print(f"trials: {states}")
    if result.best_trial is not None:
        print(f"best: trial {result.best_trial}, valid {result.best_value:.4f}, {result.best_params}")
    if result.registered:
        d = result.registered["decision"]
        verdict = "is the champion" if d["promoted"] else "stays the challenger"
        print(f"registered {d['name']} version {d['challenger_version']}: {verdict} ({d['reason']})")
    print(f"mlflow parent run: {result.parent_run_id}  ({run_url(result.parent_run_id)})")
