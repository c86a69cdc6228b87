"""The ``ntp`` console script. Building the parser imports no heavy library (torch, Zarr, MLflow, pandas,
Prefect): each command imports its layer when it runs, so ``ntp --help`` answers at once. ``data`` (the storage
package loads Zarr) and the commands of other packages, which plug in through the ``ntp.commands`` entry point group
(the Prefect ``pipeline`` command of flows/), are only imported when they are the command being run, so this driver
never imports the layers above it."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, entry_points, version

from ntp.run.compare import add_compare_command
from ntp.run.evaluate_cmd import add_evaluate_command
from ntp.run.predict_cmd import add_predict_command
from ntp.run.scratch import owned_tempdir
from ntp.run.sweep_cmd import add_sweep_command
from ntp.run.train_cmd import add_train_command

PLUGIN_GROUP = "ntp.commands"
DATA_HELP = "build and inspect graph stores"
#: Commands that run the engine in this process (they get the worker's warning filters).
ENGINE_COMMANDS = ("train", "evaluate", "predict", "pipeline")


def _plugins() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def version_line() -> str:
    """``ntp 0.1.0 (torch 2.13.0, Python 3.11.9)``, from the installed packages' metadata (torch is not imported)."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"ntp {installed('ntp')} (torch {installed('torch')}, Python {sys.version.split()[0]})"


class _VersionAction(argparse.Action):
    """``--version``: the versions are only looked up when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_line())
        parser.exit()


def build_parser(load_plugin: str | None = None) -> argparse.ArgumentParser:
    """The parser. ``load_plugin`` is the command being run: ``data`` and plugin commands get their own parser (and
    their imports) only then; otherwise they are listed with a one-line help."""
    parser = argparse.ArgumentParser(
        prog="ntp",
        description="Tensor-parallel full-graph GNN training: build graph stores, train, run the "
        "Prefect pipeline, compare MLflow runs.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the versions of ntp, torch and Python")
    plugins = _plugins()
    names = ["data", "train", "evaluate", "predict", "sweep", *sorted(plugins), "compare"]
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(names) + "}")
    if load_plugin == "data":
        from storage.cli import add_data_commands  # the storage package imports Zarr

        add_data_commands(sub)
    else:
        sub.add_parser("data", help=DATA_HELP)
    add_train_command(sub)
    add_evaluate_command(sub)
    add_predict_command(sub)
    add_sweep_command(sub)
    for name, ep in sorted(plugins.items()):
        if name == load_plugin:
            ep.load()(sub)  # type: ignore[attr-defined]
        else:
            sub.add_parser(name, help=f"see `ntp {name} --help`")
    add_compare_command(sub)
    return parser


def _quiet_libraries(command: str) -> None:
    """Silence what no user can act on: MLflow's system-metrics notices, the engine's library warnings."""
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    if command in ENGINE_COMMANDS:
        from ntp.run.worker import quiet_library_warnings  # imports torch, which these commands load anyway

        quiet_library_warnings()


#: The folder of torch's compile cache during a command (ntp.run.scratch).
TORCH_CACHE_PREFIX = "ntp-torch-cache-"


@contextmanager
def _private_torch_cache() -> Iterator[None]:
    """torch makes its compile cache (``$TMPDIR/torchinductor_$USER``) when an optimizer is built; ntp compiles
    nothing, so the cache goes to a temporary folder removed at the end (unless TORCHINDUCTOR_CACHE_DIR is set), or by
    the next command if this one is killed outright (ntp.run.scratch)."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    with owned_tempdir(TORCH_CACHE_PREFIX) as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(load_plugin=argv[0] if argv else None).parse_args(argv)
    _quiet_libraries(args.command)
    with _private_torch_cache():
        if args.command == "data":
            from storage.cli import run  # turns StoreError and bad input into one line and exit code 2

            return run(args)
        return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
