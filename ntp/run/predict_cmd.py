"""``ntp predict``: apply a saved model to a store on the training launcher, exporting predictions, embeddings or
link scores as a Parquet dataset; and the arguments it shares with ``ntp evaluate``."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from ntp.config import INFERENCE_OPTIONS
from ntp.run.flags import add_config_arguments, add_launch_arguments


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, store and the launch: processes, nodes and the memory plan as for `ntp train`."""
    parser.add_argument("--model", required=True, help="model file (`ntp train --model-out FILE`) or a checkpoint")
    parser.add_argument("--store", required=True, help="graph store to apply it to (the one it was trained on)")
    parser.add_argument(
        "--any-store",
        action="store_true",
        help="apply it to a store with another fingerprint (same feature width and outputs); by "
        "default that is refused, and another width always is",
    )
    launch = parser.add_argument_group("launch (as for `ntp train`; default: one process)")
    add_launch_arguments(launch)
    add_config_arguments(parser, only=INFERENCE_OPTIONS)


def inference_spec_from_args(args: argparse.Namespace):
    from ntp.run.inference_job import inference_spec

    launch = {
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "rdzv_endpoint": args.rdzv_endpoint,
        "device": args.device,
        "job_timeout_s": args.job_timeout,
        "interface": args.interface,
        "job_id": args.job_id,
    }
    options = {name: getattr(args, name) for name in INFERENCE_OPTIONS}
    return inference_spec(args.model, args.store, any_store=args.any_store, nproc=args.nproc, launch=launch, **options)


def add_predict_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "predict",
        help="apply a saved model to a store: predictions, embeddings or link scores as Parquet",
        description="Apply a model to every node of a store in one full-graph pass (each layer computed once for "
        "all nodes), tensor parallel over --nproc processes like training, and write a Parquet dataset "
        "(one part file per rank, written in parallel, in row groups) with node ids. Exports: "
        "predictions (node_id, pred, prob: the class and the softmax probabilities; per-task sigmoid "
        "probabilities for binary/multi-label stores), embeddings (node_id, embedding: the output of "
        "--layer), scores (a link model's pair, src, dst, score, prob for --pairs). Read it with "
        "pandas.read_parquet(OUT) or pyarrow.dataset.dataset(OUT). Example: ntp predict --model "
        "model.pt --store data/stores/cora-... --out preds --nproc 2",
    )
    add_inference_arguments(parser)
    out = parser.add_argument_group("export")
    out.add_argument("--out", required=True, help="dataset folder to write (must not exist, unless --overwrite)")
    out.add_argument(
        "--export",
        choices=("predictions", "embeddings", "scores"),
        default="predictions",
        help="what to write (default: predictions)",
    )
    out.add_argument(
        "--layer",
        type=int,
        default=None,
        help="embeddings: which layer's output (before its activation): coupled models' GNN layers, "
        "decoupled models' MLP Linears then the propagated output; negative counts from the end "
        "(default: the last hidden layer; link models: -1, the encoder's output)",
    )
    out.add_argument(
        "--pairs", default=None, help="scores: node pairs, a .npy [k, 2], a .parquet with columns src, dst, or a .csv"
    )
    out.add_argument(
        "--format",
        choices=("parquet", "zarr"),
        default="parquet",
        help="parquet: a dataset of one file per rank (default); zarr: a group of arrays indexed by "
        "node id (pred, prob or embedding) in the store's codecs, written by all ranks at once",
    )
    out.add_argument(
        "--row-group",
        type=int,
        default=65536,
        help="rows per Parquet row group, at most per Zarr chunk (default: 65536)",
    )
    out.add_argument("--overwrite", action="store_true", help="replace --out if it exists (when the job succeeds)")
    parser.set_defaults(func=_run_predict)
    return parser


def _run_predict(args: argparse.Namespace) -> int:
    from ntp.engine.infer.predict import Request
    from ntp.run.inference_job import run_inference

    def predict() -> dict:
        spec = inference_spec_from_args(args)
        print(f"[ntp] {spec.describe()}", flush=True)
        request = Request(
            model=args.model,
            export=args.export,
            out=args.out,
            layer=args.layer,
            pairs=args.pairs,
            row_group=args.row_group,
            fmt=args.format,
        )
        return run_inference(spec, request, overwrite=args.overwrite)

    return run_command(predict)


def run_command(body: Callable[[], dict]) -> int:
    """Print ``body()`` as JSON. Exit codes: 0 done, 1 the job failed, 2 bad input (nothing ran), 130/143
    interrupted."""
    from ntp.errors import Terminated
    from ntp.run.processes import exit_code, sigterm_raises

    try:
        with sigterm_raises():
            print(json.dumps(body()))
    except (Exception, KeyboardInterrupt, Terminated) as exc:
        return exit_code(exc)
    return 0
