"""What each rank runs in the ROC-AUC tests: a few epochs on a store, then the task's metrics and its own rows'
class probabilities."""

from __future__ import annotations

import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import distributed
from ntp.engine.train.loop import train_step
from ntp.engine.train.setup import setup


def metrics_and_probs(cfg: dict, epochs: int) -> tuple[dict, dict, torch.Tensor, dict]:
    """(the store's metric per split, accuracy per split, this rank's class probabilities, the splits)."""
    with distributed(60, "cpu") as env:
        job = setup(TrainConfig(**cfg), env)
        for epoch in range(epochs):
            train_step(job, epoch)
        job.model.eval()
        with torch.no_grad():
            logits = job.model(job.x, job.ctx)
        splits = {k: v.copy() for k, v in job.data.splits.items()}
        metrics = job.task.evaluate(job, logits)
        job.data.metric = "acc"  # what --metric acc evaluates
        return metrics, job.task.evaluate(job, logits), torch.softmax(logits.float(), 1), splits
