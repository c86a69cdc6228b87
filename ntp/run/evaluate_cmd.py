"""``ntp evaluate``: metrics of a saved model on a store's train/valid/test splits, on the training launcher."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ntp.run.predict_cmd import add_inference_arguments, inference_spec_from_args, run_command


def add_evaluate_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate a saved model on a store's train/valid/test splits",
        description="Evaluate a model file (`ntp train --model-out FILE`) or a checkpoint "
        "on a store, in one full-graph pass (tensor parallel with --nproc, as "
        "training); prints the metrics as JSON.",
    )
    add_inference_arguments(parser)
    parser.add_argument(
        "--out", default=None, help="also write the predictions there (a Parquet dataset, as `ntp predict --out`)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    tracking = parser.add_argument_group("tracking (MLflow)")
    tracking.add_argument(
        "--track",
        action="store_true",
        help="log the metrics, the evaluation table (per split), and for multi-class stores the "
        "per-class metrics and confusion matrix of the test split into a new evaluate run",
    )
    tracking.add_argument("--run-id", default=None, help="log them into this run instead (e.g. the training run)")
    tracking.add_argument("--experiment", default=None, help="experiment of a new run (default: the dataset's name)")
    tracking.add_argument(
        "--register",
        default=None,
        metavar="NAME",
        help="also log the model as an MLflow model (pyfunc: node ids -> predictions) and register "
        "it as a new version of NAME in the model registry (implies --track)",
    )
    parser.set_defaults(func=_run_evaluate)
    return parser


def _run_evaluate(args: argparse.Namespace) -> int:
    return run_command(lambda: evaluate(args))


def evaluate(args: argparse.Namespace) -> dict:
    """The metrics ({"train", "valid", "test", "metric", "task_type"}), the export's folder under "out", and what
    tracking logged ("run_id"; "model_uri" and "version" with --register)."""
    from ntp.engine.infer.predict import Request
    from ntp.errors import ConfigError
    from ntp.run.inference_job import run_inference

    if args.register and not _predicts_nodes(args.store):
        raise ConfigError(
            "--register logs a model whose predict takes node ids; a link prediction model scores "
            "pairs: serve it with `ntp predict --export scores` (or embeddings) instead"
        )
    spec = inference_spec_from_args(args)
    track = bool(args.track or args.run_id or args.register)
    with tempfile.TemporaryDirectory(prefix="ntp-evaluate-") as tmp:
        metrics_path = Path(tmp) / "metrics.json"
        out = args.out or (str(Path(tmp) / "predictions") if track and _predicts_nodes(args.store) else None)
        request = Request(model=args.model, out=out, metrics_out=str(metrics_path))
        run_inference(spec, request, overwrite=args.overwrite, on_line=print)
        if not metrics_path.is_file():  # several nodes: rank 0 wrote it on its own node, which reports them
            return {"metrics": "reported by the node of rank 0"}
        metrics = json.loads(metrics_path.read_text())
        logged = {}
        if track:
            from ntp.run.tracking.evaluation import track_evaluation

            logged = track_evaluation(
                args.run_id,
                metrics,
                model_path=args.model,
                store_path=args.store,
                export=out,
                experiment=args.experiment,
                register=args.register,
            )
    return {**metrics, **({"out": args.out} if args.out else {}), **logged}


def _predicts_nodes(store: str) -> bool:
    """Whether the store's task exports node predictions (what --register and the evaluation report take)."""
    from ntp.engine.tasks import task_for
    from storage import open_store

    return "predictions" in task_for(open_store(store).meta).exports
