"""What each rank runs in the link-prediction exactness and resume tests: epochs of edge mini-batches, recording
losses, the first backward's gradients, and the scores of the validation pairs; whole runs with checkpoints."""

from __future__ import annotations

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import distributed
from ntp.engine.distributed.traffic import EMBEDDING
from ntp.engine.tasks.link import pairs as link_pairs
from ntp.engine.tasks.link.data import link_from_arrays
from ntp.engine.tasks.link.pairs import score_pairs
from ntp.engine.tasks.link.task import graph_embeddings
from ntp.engine.train.loop import evaluate_splits, fit
from ntp.engine.train.setup import setup
from tests.ntp.exactness_worker import train_traced


def link_graph(n: int = 50, d: int = 7, edges: int = 260, seed: int = 0) -> dict:
    """A random undirected graph split into message-passing (train) edges and validation/test edges with negatives."""
    rng = np.random.default_rng(seed)
    pairs = np.unique(np.sort(rng.integers(0, n - 2, (edges, 2)), axis=1), axis=0)  # the last 2 nodes are isolated
    pairs = pairs[pairs[:, 0] != pairs[:, 1]][rng.permutation(len(pairs[pairs[:, 0] != pairs[:, 1]]))]
    train, valid, test = pairs[:-40], pairs[-40:-20], pairs[-20:]
    splits = {
        "train": (train, None),
        "valid": (valid, rng.integers(0, n, (30, 2))),
        "test": (test, rng.integers(0, n, (25, 2))),
    }
    graph = np.concatenate([train, train[:, ::-1]]).T
    return {"n": n, "edge_index": graph, "splits": splits, "x": rng.normal(size=(n, d)).astype(np.float32)}


def link_loader(graph: dict, features: bool):
    def load(cfg, world: int, rank: int):
        return link_from_arrays(
            graph["edge_index"], graph["n"], graph["splits"], graph["x"] if features else None, world=world, rank=rank
        )

    return load


def trace(cfg: TrainConfig, features: bool, graph: dict, epochs: int, env) -> dict:
    job = setup(cfg, env, link_loader(graph, features))
    losses, grads = train_traced(job, epochs)
    job.model.eval()
    with torch.no_grad():
        h_cols = graph_embeddings(job)
        pos, neg = job.task.eval_sets["valid"]
        scores = torch.cat([score_pairs(job.model, h_cols, p, job.comm) for p in (pos, neg)])
    sent = dict(job.comm.stats.bytes_sent)
    metrics = evaluate_splits(job)
    job.task.gather_state(job)  # the node embedding whole, as the loop gathers it for a state it keeps
    return {
        "losses": losses,
        "grads": grads,
        "scores": scores,
        "metrics": metrics,
        "state": {k: v.clone() for k, v in job.model.state_dict().items()},
        "bytes": sent,
    }


def trace_all(configs: list[tuple[dict, bool]], graph: dict, epochs: int) -> list[dict]:
    chunk = link_pairs.CPU_CHUNK
    link_pairs.CPU_CHUNK = 16  # chunks of a few pairs, split unevenly over ranks: as a large batch in big chunks
    try:
        with distributed(60, "cpu") as env:
            return [trace(TrainConfig(**c), features, graph, epochs, env) for c, features in configs]
    finally:  # it also runs in the test's own process
        link_pairs.CPU_CHUNK = chunk


def fit_run(cfg: dict, graph: dict) -> dict:
    """Train with ntp.engine.train.loop.fit (checkpoints and --resume as a job does them), featureless (learned embeddings):
    every epoch's loss, the final record and the whole embedding matrix."""
    with distributed(60, "cpu") as env:
        job = setup(TrainConfig(**cfg), env, link_loader(graph, features=False))
        gather, gathers = job.task.gather_state, []

        def counted(j, with_optimizer=False):  # the epoch each gather follows
            gathers.append(len(j.history))
            gather(j, with_optimizer)

        job.task.gather_state = counted
        final = fit(job, sinks=[])
        gather(job)  # the matrix whole as it is now (fit gathers it only for the states it keeps)
        return {
            "losses": [r.loss for r in job.history],
            "valid": [r.valid_metric for r in job.history],
            "best": (final.best_epoch, final.test_metric),
            "embedding": job.model.state_dict()["embedding.weight"],
            "gathered": [sum(w.bytes_sent.get(EMBEDDING, 0) for w in r.workers) for r in job.history],
            "gathers": gathers,
        }
