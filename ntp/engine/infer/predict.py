"""Apply a saved model on every rank of a job (``ntp predict``, ``ntp evaluate``).

Full-graph inference: one forward pass of the model over the whole graph computes each layer once for all nodes,
tensor parallel and chunked exactly as training (the same setup, memory plan and offload), with no per-node
neighbourhood recomputation. Each rank then writes its own rows: predictions (class and probabilities, or
per-task probabilities), the embeddings of one layer, or a link model's scores of its share of given node pairs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv, distributed
from ntp.engine.infer import exports
from ntp.engine.infer.inference import load_saved, load_weights, single_process_job
from ntp.engine.tasks.base import Job, Task
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError

EXPORTS = ("predictions", "embeddings", "scores")


@dataclass(frozen=True)
class Request:
    """What a job computes from the model and where it writes it."""

    model: str  #: model file or checkpoint
    export: str = "predictions"  #: predictions | embeddings | scores (link models, of ``pairs``)
    out: str | None = None  #: dataset folder of the export (None: no export)
    layer: int | None = None  #: embeddings: index into :func:`embedding_layers` (None: the default)
    pairs: str | None = None  #: scores: file of node pairs (ntp.engine.infer.exports.read_pairs)
    metrics_out: str | None = None  #: JSON file of the train/valid/test metrics (written by rank 0)
    row_group: int = exports.ROW_GROUP  #: rows per Parquet row group (at most per Zarr chunk)
    fmt: str = "parquet"  #: parquet (a dataset of one file per rank) | zarr (a group of arrays indexed by node id)


def check_export(export: str, task: Task, fmt: str = "parquet") -> None:
    """What a task's models can export (``task.exports``); Zarr arrays are indexed by node, pair scores are not."""
    if fmt == "zarr" and export == "scores":
        raise ConfigError(
            "--format zarr writes arrays indexed by node id; pair scores are rows of a table: use --format parquet"
        )
    if export not in task.exports:
        raise ConfigError(f"--export {export}: {task.exports_hint}")


def embedding_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules whose outputs (row layout, before any activation) are the embeddings ``--layer`` chooses from: a
    coupled model's GNN layers (after their residual and norm), then its jumping-knowledge head; a decoupled model's
    MLP Linears, then the propagated output; link models: their encoder's. The last one is the model's output."""
    encoder = getattr(model, "encoder", model)
    if hasattr(encoder, "taps"):
        return [*encoder.taps, *([encoder.head] if encoder.head is not None else [])]
    if hasattr(encoder, "layers"):
        return list(encoder.layers)
    return [*encoder.mlp.linears, encoder]


def default_layer(model: torch.nn.Module) -> int:
    """The last hidden layer (the last layer of the hidden width: before a decoupled model's output Linear and
    propagation); a link model's or a one-layer model's output (-1)."""
    if hasattr(model, "encoder"):
        return -1
    outputs = 2 if hasattr(model, "mlp") else 1  # layers that produce the output width
    hidden = len(embedding_layers(model)) - outputs - 1
    return hidden if hidden >= 0 else -1


def run(cfg: TrainConfig, device: str, request: Request) -> dict:
    """One rank of an inference job (or a lone process): returns what it wrote."""
    with distributed(cfg.collective_timeout_s, device) as env:
        return apply(cfg, env, request)


@torch.no_grad()
def apply(cfg: TrainConfig, env: DistEnv, request: Request) -> dict:
    """One rank's share of the job; rank 0 reports how long each phase took."""
    t0 = time.perf_counter()
    job = setup(cfg, env)
    load_weights(job, load_saved(request.model), request.model)
    job.model.eval()
    if request.out:
        check_export(request.export, job.task, request.fmt)
    phases = {"load": time.perf_counter() - t0}
    if request.export == "scores":
        written = _write_scores(job, request)
    else:
        t1 = time.perf_counter()
        columns, metrics = node_columns(job, request)
        phases["forward"] = time.perf_counter() - t1
        written = _write_nodes(job, request, columns, metrics)
    last = "write" if request.export != "scores" else "score and write"
    phases[last] = time.perf_counter() - t0 - sum(phases.values())
    if env.is_main:
        took = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items())
        print(f"[ntp] {request.export} on {env.world} rank(s): {took} (rank 0)", flush=True)
    return written


def _write_nodes(job: Job, request: Request, columns: dict[str, np.ndarray], metrics: dict) -> dict:
    if request.metrics_out and job.env.is_main:
        record = {**metrics, "metric": job.data.metric, "task_type": job.data.task_type}
        Path(request.metrics_out).write_text(json.dumps(record))
    part = job.task.output_rows(job)
    rows = part.rows()
    if request.out and request.fmt == "zarr":
        exports.write_zarr_rows(request.out, rows, part.num_nodes, columns, request.row_group, job.env.is_main)
    elif request.out:
        exports.write_parquet_part(request.out, job.env.rank, columns, request.row_group)
    return {"rank": job.env.rank, "rows": rows}


def node_columns(job: Job, request: Request) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """This rank's rows of the export (node ids first) from one forward pass, and the train/valid/test metrics
    when ``request.metrics_out`` asks for them (computed, like training's, by every rank together)."""
    layers = embedding_layers(job.model)
    layer = default_layer(job.model) if request.layer is None else request.layer
    if not -len(layers) <= layer < len(layers):
        raise ConfigError(
            f"--layer {layer}: this model has {len(layers)} layers to take embeddings from "
            f"(0..{len(layers) - 1}, or -1 for the output)"
        )
    captured: list[torch.Tensor] = []
    hook = layers[layer].register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        logits = job.model(job.x, job.ctx)
    finally:
        hook.remove()
    metrics = {}
    if request.metrics_out:
        metrics = job.task.evaluate(job, logits)
    ids = np.arange(*job.task.output_rows(job).rows(), dtype=np.int64)
    if request.export == "embeddings":
        return {"node_id": ids, "embedding": job.task.layer_rows(job, captured[-1]).float().cpu().numpy()}, metrics
    return {"node_id": ids, **_prediction_columns(job, logits)}, metrics


def predict_in_process(model: str | Path, store: str | Path, any_store: bool = False) -> dict[str, np.ndarray]:
    """Predictions of every node (node_id, pred, prob) in this process: what the MLflow model serves."""
    job = single_process_job(model, store, any_store)
    with torch.no_grad():
        return node_columns(job, Request(model=str(model)))[0]


def _prediction_columns(job: Job, logits: torch.Tensor) -> dict[str, np.ndarray]:
    """Multi-class: the class and the softmax probabilities; binary/multi-label: per-task sigmoid probabilities
    and 0/1 predictions."""
    logits = logits.float().cpu()
    if job.data.task_type == "multiclass":
        return {"pred": logits.argmax(1).numpy(), "prob": torch.softmax(logits, 1).numpy()}
    prob = torch.sigmoid(logits)
    return {"pred": (prob >= 0.5).to(torch.int8).numpy(), "prob": prob.numpy()}


def _write_scores(job: Job, request: Request) -> dict:
    """A link model's scores (the decoder's logit and its sigmoid) of this rank's share of each batch of pairs."""
    pairs = torch.from_numpy(exports.read_pairs(request.pairs))
    idx, score = job.task.pair_scores(job, pairs)
    columns = {
        "pair": idx.numpy(),
        "src": pairs[idx, 0].numpy(),
        "dst": pairs[idx, 1].numpy(),
        "score": score.numpy(),
        "prob": torch.sigmoid(score).numpy(),
    }
    path = exports.write_parquet_part(request.out, job.env.rank, columns, request.row_group)
    return {"rank": job.env.rank, "pairs": len(idx), "path": str(path)}
