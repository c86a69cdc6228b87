"""``ntp evaluate``: metrics of a saved model on a store's train/valid/test splits."""
from __future__ import annotations

import argparse
import json
import sys


def add_evaluate_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("evaluate", help="evaluate a saved model on a store's train/valid/test splits",
                                   description="Evaluate a model file (`ntp train --model-out FILE`) or a checkpoint "
                                               "on a store; prints the metrics as JSON.")
    parser.add_argument("--model", required=True, help="model file written by `ntp train --model-out FILE`")
    parser.add_argument("--store", required=True, help="graph store to evaluate on")
    parser.add_argument("--any-store", action="store_true",
                        help="evaluate even on a store other than the one the model was trained on (another "
                             "fingerprint); by default that is refused")
    parser.set_defaults(func=_run_evaluate)
    return parser


def _run_evaluate(args: argparse.Namespace) -> int:
    from ntp.engine.inference import evaluate_model
    from ntp.errors import is_input_error

    try:
        print(json.dumps(evaluate_model(args.model, args.store, any_store=args.any_store)))
    except Exception as exc:
        if not is_input_error(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
