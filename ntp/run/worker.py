"""The program every rank runs: ``python -m ntp.run.rendezvous --nproc-per-node M -- -m ntp.run.worker --store STORE
...`` (torchrun through ntp.run.rendezvous, which hands the worker all of its flags).

It reads the training flags, resolves the launch from torchrun's environment (ntp.spec) and trains
(ntp.engine.train.loop). A failing rank prints its traceback between markers, so the launcher can show the rank that
failed first-hand rather than the peers that lost their connection to it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from torch.distributed.elastic.multiprocessing.errors import record

from ntp.errors import ConfigError
from ntp.run.flags import add_config_arguments, config_from_args
from ntp.run.processes import die_with_parent
from ntp.spec import DEVICES, resolve_in_worker

#: Markers around a failing rank's traceback (found by ntp.run.launch.failure_message).
FAILURE_BEGIN, FAILURE_END = "===== ntp rank failed", "===== end of ntp rank failure"
#: Library warnings about the engine's own use of torch that no user can act on: (message, category, module).
LIBRARY_WARNINGS = (
    ("Sparse CSR tensor support is in beta state", UserWarning, r"ntp\.engine\."),
    ("Sparse invariant checks are implicitly disabled", UserWarning, r"ntp\.engine\."),
)


def quiet_library_warnings() -> None:
    """Ignore exactly :data:`LIBRARY_WARNINGS` (by message, category and the module they point at)."""
    for message, category, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ntp.run.worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser)
    parser.add_argument("--device", choices=DEVICES, default="auto", help="cuda, cpu or auto (default: auto)")
    return parser


@record
def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # torchrun killed outright (its launcher gone, the OOM killer): this rank stops too
    quiet_library_warnings()
    args = build_parser().parse_args(argv)
    try:
        spec = resolve_in_worker(config_from_args(args), args.device)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ntp.engine.train.loop import run

    with failure_reported():
        run(spec)
    return 0


@contextmanager
def failure_reported() -> Iterator[None]:
    """A failing rank prints its traceback between the markers the launcher looks for, then fails."""
    try:
        yield
    except BaseException:
        rank = os.environ.get("RANK", "0")
        print(
            f"{FAILURE_BEGIN} (rank {rank}) =====\n{traceback.format_exc().rstrip()}\n{FAILURE_END} (rank {rank}) =====",
            file=sys.stderr,
            flush=True,
        )
        raise


if __name__ == "__main__":
    sys.exit(main())
