"""The program every rank of an inference job runs: ``torchrun ... -m ntp.run.predict_worker --model FILE ...``
with the model's inference config as training flags (ntp.engine.infer.predict does the work)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from torch.distributed.elastic.multiprocessing.errors import record

from ntp.engine.infer.predict import EXPORTS, Request
from ntp.run.flags import add_config_arguments, config_from_args
from ntp.run.processes import die_with_parent
from ntp.run.worker import failure_reported, quiet_library_warnings
from ntp.spec import DEVICES, resolve_in_worker


def request_argv(request: Request) -> list[str]:
    """The flags that carry ``request`` to the ranks."""
    argv: list[str] = []
    for f in fields(Request):
        value = getattr(request, f.name)
        if value is not None:
            argv += [f"--request-{f.name.replace('_', '-')}", str(value)]
    return argv


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ntp.run.predict_worker", description=__doc__)
    add_config_arguments(parser)
    parser.add_argument("--device", choices=DEVICES, default="auto")
    # the request's flags are prefixed: the training flags already have a --model (gcn, ...)
    parser.add_argument("--request-model", required=True)
    parser.add_argument("--request-export", choices=EXPORTS, default="predictions")
    parser.add_argument("--request-out", default=None)
    parser.add_argument("--request-layer", type=int, default=None)
    parser.add_argument("--request-pairs", default=None)
    parser.add_argument("--request-metrics-out", default=None)
    parser.add_argument("--request-row-group", type=int, default=Request.row_group)
    parser.add_argument("--request-fmt", choices=("parquet", "zarr"), default=Request.fmt)
    return parser


@record
def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    quiet_library_warnings()
    args = build_parser().parse_args(argv)
    spec = resolve_in_worker(config_from_args(args), args.device)
    request = Request(**{f.name: getattr(args, f"request_{f.name}") for f in fields(Request)})
    from ntp.engine.infer.predict import run

    with failure_reported():
        run(spec.config, spec.device, request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
