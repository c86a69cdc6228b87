"""What each rank runs in the exactness tests: a few epochs of every model, recording losses, gradients, logits."""

from __future__ import annotations

import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import distributed
from ntp.engine.train.loop import train_step
from ntp.engine.train.setup import setup
from tests.ntp.graphs import loader


def trace(cfg: TrainConfig, graph: dict, epochs: int, job_env=None) -> dict:
    """Losses per epoch, every parameter's gradient after the first backward, final eval logits of own rows."""
    job = setup(cfg, job_env, loader(graph))
    losses, grads = train_traced(job, epochs)
    job.model.eval()
    with torch.no_grad():
        logits = job.model(job.x, job.ctx)
    return {
        "losses": losses,
        "grads": grads,
        "logits": logits,
        "bytes": dict(job.comm.stats.bytes_sent),
        "calls": dict(job.comm.stats.calls),
    }


def train_traced(job, epochs: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``epochs`` epochs: the loss of each, and every parameter's gradient after the first backward."""
    losses, grads = [], None
    for epoch in range(epochs):
        losses.append(train_step(job, epoch))
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in job.model.named_parameters()}
    return losses, grads


def trace_all(configs: list[dict], graph: dict, epochs: int) -> list[dict]:
    """Run every config on this rank (one process group for all of them)."""
    with distributed(60, "cpu") as env:
        return [trace(TrainConfig(**c), graph, epochs, env) for c in configs]


def trace_all_on_shared_gpu(configs: list[dict], graph: dict, epochs: int) -> list[dict]:
    """As :func:`trace_all`, each rank on the one CUDA GPU of the machine, the ranks sharing it through host-staged
    collectives (ntp.engine.distributed.dist.SHARED_GPU_ENV: a testing mode); results moved to the CPU."""
    import os

    from ntp.engine.distributed.dist import SHARED_GPU_ENV

    os.environ[SHARED_GPU_ENV] = "1"
    with distributed(60, "cuda") as env:
        traced = [trace(TrainConfig(**c), graph, epochs, env) for c in configs]
    return [{**t, "logits": t["logits"].cpu(), "grads": {k: g.cpu() for k, g in t["grads"].items()}} for t in traced]
