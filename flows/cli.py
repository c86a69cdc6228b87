"""The ``ntp`` console script. Subcommands import their layer lazily, so `ntp data` and `ntp train` never load Prefect."""
from __future__ import annotations

import argparse
import sys


def build_parser(with_pipeline: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ntp", description="Tensor-parallel full-graph GNN training: build graph stores, train, run the "
                                "Prefect pipeline, compare MLflow runs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{data,train,evaluate,pipeline,compare}")
    from storage.cli import add_data_commands
    from ntp.compare import add_compare_command
    from ntp.evaluate import add_evaluate_command
    from ntp.train_cli import add_train_command

    add_data_commands(sub)
    add_train_command(sub)
    add_evaluate_command(sub)
    if with_pipeline:  # needs Prefect: only imported when it is the command being run
        from flows.pipeline_cli import add_pipeline_command

        add_pipeline_command(sub)
    else:
        sub.add_parser("pipeline", help="run prepare -> train -> evaluate as a Prefect flow (see `ntp pipeline --help`)")
    add_compare_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(with_pipeline=argv[:1] == ["pipeline"]).parse_args(argv)
    if args.command == "data":
        from storage.cli import run  # turns StoreError and bad input into one line and exit code 2

        return run(args)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
