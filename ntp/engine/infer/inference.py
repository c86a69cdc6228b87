"""A saved model (a ``--model-out`` file or a checkpoint) made ready to apply: loaded, checked against the store it
is applied to, its config turned into an inference config; and its metrics in one process (``evaluate_model``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ntp.config import INFERENCE_OPTIONS, TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.tasks import task_for
from ntp.engine.tasks.base import Job
from ntp.engine.train import checkpoint
from ntp.engine.train.loop import evaluate_splits
from ntp.engine.train.setup import setup
from ntp.errors import ModelFileError

#: Options of the saved config that describe the training run, not the model: reset for inference.
_TRAINING_ONLY = {
    "mode": None,
    "resume": False,
    "resume_anyway": False,
    "results": None,
    "checkpoint_dir": None,
    "model_out": None,
    "overlap": False,
    "fail_at_epoch": -1,
    "fail_rank": -1,
    "fit_on": "train",  # the store's splits as they are: a model fitted on train+valid is scored on each
}


def load_saved(path: str | Path) -> dict:
    """The saved dict of a model file or checkpoint; ModelFileError naming the file when it is missing or damaged."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist; train with --model-out FILE to write one")
    try:
        return checkpoint.load(path)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ModelFileError(f"model file {path} cannot be read ({exc}); retrain to write it again") from exc


def inference_config(saved: dict, store: str | Path, **options) -> TrainConfig:
    """The saved config, reset for inference on ``store``, with ``options`` (of :data:`INFERENCE_OPTIONS`) set."""
    unknown = set(options) - set(INFERENCE_OPTIONS)
    if unknown:
        raise ValueError(f"not inference options: {sorted(unknown)}; expected some of {INFERENCE_OPTIONS}")
    saved_cfg = TrainConfig.from_dict(saved["config"]).to_dict()  # old key names become today's
    given = {k: v for k, v in options.items() if v is not None}
    return TrainConfig.from_dict({**saved_cfg, **_TRAINING_ONLY, **given, "store": str(store)})


def check_store(path: str | Path, saved: dict, store_path: str | Path, any_store: bool = False) -> None:
    """A model applies to the store it was trained on. Another feature width or output width cannot work at all;
    another fingerprint (same shapes, other graph or data) only with ``any_store``."""
    from storage import open_store

    meta = open_store(store_path).meta
    _check_widths(path, saved, store_path, meta)
    fingerprint = saved.get("store_fingerprint")
    if not fingerprint:  # None: an older version; "": trained on in-memory arrays
        print(
            f"[ntp] warning: model file {path} has no store fingerprint (older version, or in-memory data): "
            f"whether it was trained on store {store_path} is unknown",
            file=sys.stderr,
            flush=True,
        )
    elif fingerprint != meta.fingerprint and not any_store:
        raise ModelFileError(
            f"model {path} was trained on a store with fingerprint {fingerprint}, but store "
            f"{store_path} has fingerprint {meta.fingerprint}: apply it to the store it was trained "
            "on, or pass --any-store (any_store=True) if you mean to apply it to this one"
        )


def _check_widths(path: str | Path, saved: dict, store_path: str | Path, meta) -> None:
    in_dim, out_dim = saved.get("in_dim"), saved.get("out_dim")  # absent in checkpoints: load_weights checks
    if in_dim is not None and in_dim != meta.feature_dim:
        raise ModelFileError(
            f"model {path} takes {in_dim} features per node, but store {store_path} has "
            f"{meta.feature_dim}: a model applies only to stores with its feature width; apply it "
            "to the store it was trained on (or one built the same way)"
        )
    store_out = meta.num_classes if meta.task_type == "multiclass" else meta.num_tasks
    if "predictions" in task_for(meta).exports and out_dim is not None and out_dim != store_out:
        raise ModelFileError(
            f"model {path} predicts {out_dim} outputs, but store {store_path} has {store_out} "
            f"({meta.task_type}); apply it to a store with the same classes or tasks"
        )


def load_weights(job: Job, saved: dict, path: str | Path) -> None:
    weights = saved["state_dict"] if "state_dict" in saved else saved["model"]  # model file / checkpoint
    try:
        job.model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ModelFileError(
            f"model {path} does not fit store {job.cfg.store} ({job.data.feature_dim} features, "
            f"{job.data.out_dim} outputs): apply it to the store it was trained on"
        ) from exc


def single_process_job(model_path: str | Path, store_path: str | Path, any_store: bool = False) -> Job:
    """The saved model, checked against the store and loaded, in this one process (eval mode)."""
    saved = load_saved(model_path)
    check_store(model_path, saved, store_path, any_store)
    job = setup(
        inference_config(saved, store_path).replace(mode="single"), DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
    )
    load_weights(job, saved, model_path)
    job.model.eval()
    return job


def evaluate_model(model_path: str | Path, store_path: str | Path, any_store: bool = False) -> dict:
    """Metrics of a saved model on train/valid/test in this process: {"train", "valid", "test", "metric",
    "task_type"}. The store must be the one it was trained on (same fingerprint) unless ``any_store``."""
    job = single_process_job(model_path, store_path, any_store)
    target = {"target_type": t} if (t := job.task.target_type(job)) else {}
    return {**evaluate_splits(job), "metric": job.data.metric, "task_type": job.data.task_type, **target}
