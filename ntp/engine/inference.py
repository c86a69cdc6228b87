"""Apply a saved model (a ``--model-out`` file or a checkpoint) to a store, in one process."""
from __future__ import annotations

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
    saved_cfg = TrainConfig.from_dict(saved["config"]).to_dict()  # old key names become today's
    cfg = TrainConfig.from_dict({**saved_cfg, **_TRAINING_ONLY, "store": str(store_path)})
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None))
    weights = saved["state_dict"] if "state_dict" in saved else saved["model"]  # model file / checkpoint
    try:
        job.model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ModelFileError(f"model {path} does not fit store {store_path} ({job.data.feature_dim} features, "
                             f"{job.data.out_dim} outputs): evaluate it on the store it was trained on") from exc
    return {**evaluate_splits(job), "metric": job.data.metric}
