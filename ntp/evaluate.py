"""Evaluate a saved model (the file written at --model-out) on a store's splits, in one process."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ntp import checkpoint
from ntp.config import TrainConfig
from ntp.dist import DistEnv
from ntp.train import evaluate_splits, setup


class ModelFileError(ValueError):
    """The model file is missing, unreadable, or does not fit the store."""


def evaluate_model(model_path: str | Path, store_path: str | Path) -> dict:
    """Metrics of a saved model (``--model-out`` file) or a checkpoint (``ckpt-*.pt`` in ``--checkpoint-dir``) on
    train/valid/test: {"train", "valid", "test", "metric"}."""
    path = Path(model_path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist; train with --model-out FILE to write one")
    try:
        saved = checkpoint.load(path)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ModelFileError(f"model file {path} cannot be read ({exc}); retrain to write it again") from exc
    cfg = TrainConfig.from_dict({**saved["config"], "store": str(store_path), "mode": "single", "resume": False,
                                 "results": None, "checkpoint_dir": None, "model_out": None})
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None))
    weights = saved["state_dict"] if "state_dict" in saved else saved["model"]  # model file / checkpoint
    try:
        job.model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ModelFileError(f"model {path} does not fit store {store_path} ({job.data.feature_dim} features, "
                             f"{job.data.out_dim} outputs): evaluate it on the store it was trained on") from exc
    return {**evaluate_splits(job), "metric": job.data.metric}


def add_evaluate_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("evaluate", help="evaluate a saved model on a store's train/valid/test splits")
    parser.add_argument("--model", required=True, help="model file written by `ntp train --model-out FILE`")
    parser.add_argument("--store", required=True, help="graph store to evaluate on")
    parser.set_defaults(func=_run_evaluate)
    return parser


def _run_evaluate(args: argparse.Namespace) -> int:
    from storage import StoreError

    try:
        print(json.dumps(evaluate_model(args.model, args.store)))
    except (ModelFileError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
