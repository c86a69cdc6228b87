"""The ``ntp`` console script. Subcommands import their layer lazily, so `ntp data` and `ntp train` never load
Prefect. Commands of other packages plug in through the ``ntp.commands`` entry point group (the Prefect
``pipeline`` command of flows/ does), so this driver never imports the layers above it."""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

PLUGIN_GROUP = "ntp.commands"


def _plugins() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def build_parser(load_plugin: str | None = None) -> argparse.ArgumentParser:
    """The parser; a plugin command is only imported (with its dependencies) when it is the one being run."""
    parser = argparse.ArgumentParser(
        prog="ntp", description="Tensor-parallel full-graph GNN training: build graph stores, train, run the "
                                "Prefect pipeline, compare MLflow runs.")
    plugins = _plugins()
    names = ["data", "train", "evaluate", *sorted(plugins), "compare"]
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(names) + "}")
    from ntp.run.compare import add_compare_command
    from ntp.run.evaluate_cmd import add_evaluate_command
    from ntp.run.train_cmd import add_train_command
    from storage.cli import add_data_commands

    add_data_commands(sub)
    add_train_command(sub)
    add_evaluate_command(sub)
    for name, ep in sorted(plugins.items()):
        if name == load_plugin:
            ep.load()(sub)  # type: ignore[attr-defined]
        else:
            sub.add_parser(name, help=f"see `ntp {name} --help`")
    add_compare_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(load_plugin=argv[0] if argv else None).parse_args(argv)
    if args.command == "data":
        from storage.cli import run  # turns StoreError and bad input into one line and exit code 2

        return run(args)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
