"""Heterogeneous graphs for the R-GCN tests, and what each rank runs: a few epochs, recording losses, gradients
(embedding tables as this rank's column slice) and the target type's logits of the rank's own rows."""

from __future__ import annotations

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import distributed
from ntp.engine.tasks.hetero.data import hetero_from_arrays
from ntp.engine.train.loop import train_step
from ntp.engine.train.setup import setup


def hetero_graph(seed: int = 0) -> dict:
    """Three node types of uneven sizes (29 papers with 13 features, 17 authors with 7, 10 featureless topics), five
    directed relations (one a type to itself), labels on papers that correlate with their features."""
    rng = np.random.default_rng(seed)
    counts = {"author": 17, "paper": 29, "topic": 10}

    def rel(s: str, d: str, e: int) -> np.ndarray:
        return np.stack([rng.integers(0, counts[s], e), rng.integers(0, counts[d] - 2, e)])  # last 2: no in-edges

    edges = {
        ("author", "writes", "paper"): rel("author", "paper", 40),
        ("paper", "cites", "paper"): rel("paper", "paper", 60),
        ("paper", "has_topic", "topic"): rel("paper", "topic", 35),
        ("topic", "of", "paper"): rel("topic", "paper", 30),
        ("paper", "written_by", "author"): rel("paper", "author", 25),
    }
    y = rng.integers(0, 4, counts["paper"])
    y[3] = -1  # an unlabeled paper inside the train split
    x_paper = rng.normal(size=(counts["paper"], 13)).astype(np.float32)
    x_paper[:, :4] += 2.0 * np.eye(4, dtype=np.float32)[np.maximum(y, 0)]
    features = {"paper": x_paper, "author": rng.normal(size=(counts["author"], 7)).astype(np.float32)}
    perm = rng.permutation(counts["paper"])
    splits = {"train": np.sort(np.append(perm[:14], 3)), "valid": np.sort(perm[14:21]), "test": np.sort(perm[21:])}
    splits["train"] = np.unique(splits["train"])
    return dict(counts=counts, edges=edges, features=features, target="paper", labels=y, splits=splits)


def hetero_loader(graph: dict):
    def load(cfg, world: int, rank: int):
        return hetero_from_arrays(
            graph["counts"],
            graph["edges"],
            graph["features"],
            graph["target"],
            graph["labels"],
            {k: v for k, v in graph["splits"].items()},
            world=world,
            rank=rank,
            num_classes=4,
        )

    return load


def trace(cfg: TrainConfig, graph: dict, epochs: int, env) -> dict:
    job = setup(cfg, env, hetero_loader(graph))
    losses, grads = [], None
    for epoch in range(epochs):
        losses.append(train_step(job, epoch))
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in job.model.named_parameters()}
    job.model.eval()
    with torch.no_grad():
        logits = job.model(job.x, job.ctx)
    traffic = dict(job.comm.stats.bytes_sent), dict(job.comm.stats.calls)  # the model's, before the tables' gather
    job.task.gather_state(job)  # the whole tables for the state dict, as the loop gathers them for a state it keeps
    sliced = [n for n, p in job.model.named_parameters() if any(p is q for q in job.model.sliced())]
    return {
        "losses": losses,
        "grads": grads,
        "logits": logits,
        "sliced": sliced,
        "bytes": traffic[0],
        "calls": traffic[1],
        "state": {k: v.clone() for k, v in job.model.state_dict().items()},
    }


def featureless(graph: dict) -> dict:
    """The same graph with no features at all (R-GCN's one-hot input layer)."""
    return dict(graph, features={})


def trace_all(configs: list[dict], graph: dict, epochs: int) -> list[dict]:
    """Every config on this rank; a config with ``featureless=True`` runs on the graph without features."""
    with distributed(60, "cpu") as env:
        return [
            trace(
                TrainConfig(model="rgcn", **{k: v for k, v in c.items() if k != "featureless"}),
                featureless(graph) if c.get("featureless") else graph,
                epochs,
                env,
            )
            for c in configs
        ]


def fit_runs(configs: list[dict], graph: dict) -> list[dict]:
    """Train each config with ntp.engine.train.loop.fit (checkpoints and --resume as a job does them); a config with
    ``featureless=True`` runs on the graph without features. Every epoch's loss, the final record and the state dict
    (whole embedding tables)."""
    from ntp.engine.train.loop import fit

    out = []
    with distributed(60, "cpu") as env:
        for c in configs:
            cfg = TrainConfig(model="rgcn", **{k: v for k, v in c.items() if k != "featureless"})
            job = setup(cfg, env, hetero_loader(featureless(graph) if c.get("featureless") else graph))
            final = fit(job, sinks=[])
            job.task.gather_state(job)
            out.append(
                {
                    "losses": [r.loss for r in job.history],
                    "valid": [r.valid_metric for r in job.history],
                    "best": (final.best_epoch, final.test_metric),
                    "state": {k: v.clone() for k, v in job.model.state_dict().items()},
                }
            )
    return out


def hetero_budget(chunk_bytes: int, cfg: dict, graph: dict, world: int) -> str:
    """A ``--memory-budget`` that leaves ``chunk_bytes`` to the aggregation chunks of R-GCN once what stays resident
    on a rank is counted, as the ranks count it (ntp.engine.tasks.hetero.memory)."""
    from ntp.engine.tasks.hetero.memory import operator_degrees, resident_parts

    c = TrainConfig(model="rgcn", **{k: v for k, v in cfg.items() if k != "featureless"})
    data = hetero_loader(featureless(graph) if cfg.get("featureless") else graph)(c, 1, 0)
    one_hot = c.arch == "coupled" and not any(data.feature_dims.values()) and c.decomposition != "block"
    degrees = operator_degrees(data.relations, data.counts, one_hot)
    parts = resident_parts(c, data.relations, data.counts, data.feature_dims, data.num_classes, world, degrees)
    return f"{sum(parts.values()) + chunk_bytes}B"
