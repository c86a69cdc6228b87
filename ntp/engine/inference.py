"""Apply a saved model (a ``--model-out`` file or a checkpoint) to a store, in one process."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from ntp.config import TrainConfig
from ntp.engine import checkpoint
from ntp.engine.dist import DistEnv
from ntp.engine.loop import evaluate_splits
from ntp.engine.setup import setup
from ntp.errors import ModelFileError

#: Options of the saved config that describe the training run, not the model: reset for evaluation.
_TRAINING_ONLY = {"mode": "single", "resume": False, "results": None, "checkpoint_dir": None, "model_out": None,
                  "overlap": False}


def evaluate_model(model_path: str | Path, store_path: str | Path, any_store: bool = False) -> dict:
    """Metrics of a saved model (``--model-out`` file) or a checkpoint (``ckpt-*.pt`` in ``--checkpoint-dir``) on
    train/valid/test: {"train", "valid", "test", "metric", "task_type"}. The store must be the one it was trained on (same
    fingerprint) unless ``any_store``."""
    path = Path(model_path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist; train with --model-out FILE to write one")
    try:
        saved = checkpoint.load(path)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ModelFileError(f"model file {path} cannot be read ({exc}); retrain to write it again") from exc
    _check_store(path, saved.get("store_fingerprint"), store_path, any_store)
    saved_cfg = TrainConfig.from_dict(saved["config"]).to_dict()  # old key names become today's
    cfg = TrainConfig.from_dict({**saved_cfg, **_TRAINING_ONLY, "store": str(store_path)})
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None))
    weights = saved["state_dict"] if "state_dict" in saved else saved["model"]  # model file / checkpoint
    try:
        job.model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ModelFileError(f"model {path} does not fit store {store_path} ({job.data.feature_dim} features, "
                             f"{job.data.out_dim} outputs): evaluate it on the store it was trained on") from exc
    target = {"target_type": job.data.target} if getattr(job.data, "hetero", False) else {}
    return {**evaluate_splits(job), "metric": job.data.metric, "task_type": job.data.task_type, **target}


def _check_store(path: Path, saved: str | None, store_path: str | Path, any_store: bool) -> None:
    """Same shapes are not the same graph: a model of another store would give numbers that mean nothing."""
    from storage import open_store

    current = open_store(store_path).meta.fingerprint
    if not saved:  # None: an older version; "": trained on in-memory arrays
        print(f"[ntp] warning: model file {path} has no store fingerprint (older version, or in-memory data): "
              f"whether it was trained on store {store_path} is unknown", file=sys.stderr, flush=True)
    elif saved != current and not any_store:
        raise ModelFileError(f"model {path} was trained on a store with fingerprint {saved}, but store {store_path} "
                             f"has fingerprint {current}: evaluate it on the store it was trained on, or pass "
                             "--any-store (any_store=True) if you mean to apply it to this one")
