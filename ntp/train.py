"""The training loop. Entry point of every worker: ``torchrun --nproc-per-node M -m ntp.train --store STORE ...``."""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

from ntp import checkpoint, placement
from ntp.aggregate import CSR
from ntp.chunking import free_device_bytes
from ntp.collectives import Comm, all_reduce_gradients
from ntp.config import ConfigError, TrainConfig, add_config_arguments, config_from_args
from ntp.context import GraphContext
from ntp.data import GraphData, load_rank_data
from ntp.data_parallel import DataParallelContext
from ntp.dist import DistEnv, all_gather_objects, check_same_on_all_ranks, distributed
from ntp.evaluation import compute_metric
from ntp.launch import FAILURE_BEGIN, FAILURE_END
from ntp.metrics import ALLREDUCE, reset_peak_memory, worker_record
from ntp.models import build_model
from ntp.partition import Layout, ceil_div

SPLITS = ("train", "valid", "test")
#: (config, world size, rank) -> this rank's GraphData
DataLoader = Callable[[TrainConfig, int, int], GraphData]


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, injected failure); the message says why and what to try."""


@dataclass
class Job:
    """Everything one rank trains with."""

    cfg: TrainConfig
    env: DistEnv
    data: GraphData
    comm: Comm
    ctx: GraphContext
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor  # this rank's feature rows
    y: torch.Tensor  # labels of this rank's rows
    local_split: dict[str, torch.Tensor]  # split name -> local row ids of labeled vertices in the split
    global_train_count: int
    best: dict = field(default_factory=lambda: {"epoch": -1, "valid": float("-inf"), "test": None, "state": None})
    history: list[dict] = field(default_factory=list)  # epoch records (rank 0 writes them)


# -- setup ----------------------------------------------------------------------------------------------------------
def setup(cfg: TrainConfig, env: DistEnv, load: DataLoader | None = None) -> Job:
    if env.world > 1 and cfg.mode == "single":
        raise ConfigError("--mode single runs one process; use --mode tp with several processes (or --nproc 1)")
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // env.local_world))
    if cfg.pipeline and env.device.type == "cpu" and env.world > 1 and env.is_main:
        _warn_cpu_pipelining(env.local_world * torch.get_num_threads())
    data = (load or _load_from_store)(cfg, env.world, env.rank)
    layout = Layout(data.num_nodes, env.world, env.rank)
    check_same_on_all_ranks(env, "graph (nodes, edges, feature width, classes)",
                            (data.num_nodes, data.num_edges, data.feature_dim, data.out_dim, cfg.to_json()))
    comm = Comm(layout, env.device, group=None)
    csr = CSR.from_numpy(data.indptr, data.indices)
    width = data.out_dim if cfg.arch == "decoupled" else max(cfg.hidden, data.out_dim)
    model = build_model(cfg, data.feature_dim, data.out_dim)
    nn_device, nn_bytes = _place_nn_stage(cfg, env, data, model, width)
    ctx_cls = DataParallelContext if cfg.mode == "data" else GraphContext
    ctx = ctx_cls(csr, comm, chunk_rows=cfg.chunk_rows, seed=cfg.seed, memory_budget=cfg.memory_budget_bytes,
                  pipeline=cfg.pipeline, offload=cfg.offload, width=width, nn_device=nn_device,
                  reserved_bytes=nn_bytes if nn_device == env.device else 0)
    model = model.to(nn_device)
    opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = opt_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    r0, r1 = layout.rows()
    y_all = torch.from_numpy(np.asarray(data.labels))
    local_split = {name: _local_labeled(data.splits[name], y_all, r0, r1) for name in SPLITS}
    train_ids = torch.from_numpy(np.asarray(data.splits["train"], dtype=np.int64))
    train_count = int(_labeled(y_all[train_ids]).sum())
    if train_count == 0:
        raise ConfigError(f"graph {data.name!r} has no labeled training vertex: nothing to train on; give labels and "
                          "a train split when building the store (`ntp data prepare ... --labels FILE --splits DIR`)")
    return Job(cfg, env, data, comm, ctx, model, optimizer, x=torch.from_numpy(data.features).to(nn_device),
               y=y_all[r0:r1].to(nn_device), local_split={k: v.to(nn_device) for k, v in local_split.items()},
               global_train_count=train_count)


def _warn_cpu_pipelining(busy_threads: int) -> None:
    cores = os.cpu_count() or 1
    if busy_threads >= cores:
        print(f"[ntp] warning: --pipeline on CPU ranks that use all {cores} cores ({busy_threads} compute threads): "
              "gloo's communication is CPU work too, so it has nothing idle to overlap with and pipelining may be a "
              "few percent slower here (docs/benchmarks.md, section 6); it pays where a GPU or a network link "
              "moves the data", flush=True)


def _place_nn_stage(cfg: TrainConfig, env: DistEnv, data: GraphData, model: torch.nn.Module,
                    width: int) -> tuple[torch.device, int]:
    """Where the NN stage runs (ntp.placement) and the device memory it needs there."""
    rows = Layout(data.num_nodes, env.world, env.rank).num_rows()
    params = sum(p.numel() for p in model.parameters())
    nn_bytes = placement.nn_stage_bytes(rows, data.feature_dim, cfg.hidden, data.out_dim, cfg.nn_layers, params)
    graph_bytes = placement.graph_resident_bytes(data.num_nodes, data.num_edges, ceil_div(width, env.world), cfg.offload)
    graph_bytes += cfg.memory_budget_bytes
    free = free_device_bytes(env.device)
    device = placement.choose_nn_device(cfg.nn_device, env.device, nn_bytes, graph_bytes, free)
    if free and env.is_main:
        print(f"[ntp] {placement.describe(device, nn_bytes, graph_bytes, free)}", flush=True)
    return device, nn_bytes


def _load_from_store(cfg: TrainConfig, world: int, rank: int) -> GraphData:
    if not cfg.store:
        raise ConfigError("no graph store given; pass --store PATH (build one with `ntp data prepare NAME`)")
    return load_rank_data(cfg.store, world, rank)


def _labeled(y: torch.Tensor) -> torch.Tensor:
    return y >= 0 if y.dim() == 1 else ~torch.isnan(y).all(dim=1)


def _local_labeled(ids: np.ndarray, y_all: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    own = ids_t[(ids_t >= r0) & (ids_t < r1)]
    return own[_labeled(y_all[own])] - r0


# -- one epoch ------------------------------------------------------------------------------------------------------
def loss_sum(job: Job, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Sum of per-vertex losses over ``rows`` (the caller divides by the global count)."""
    y = job.y[rows]
    if job.data.task_type == "multiclass":
        return F.cross_entropy(logits[rows], y, reduction="sum")
    mask = ~torch.isnan(y)
    return F.binary_cross_entropy_with_logits(logits[rows][mask], y[mask], reduction="sum")


def train_step(job: Job, epoch: int) -> float:
    """Forward, backward and update; returns the global mean loss over all training vertices of all ranks."""
    job.model.train()
    job.ctx.step = epoch
    job.optimizer.zero_grad(set_to_none=True)
    logits = job.model(job.x, job.ctx)
    loss = loss_sum(job, logits, job.local_split["train"]) / job.global_train_count
    loss.backward()
    all_reduce_gradients(list(job.model.parameters()), job.comm)
    job.optimizer.step()
    total = job.comm.all_reduce(loss.detach().reshape(1).clone(), ALLREDUCE)
    return float(total[0])


@torch.no_grad()
def evaluate_splits(job: Job) -> dict[str, float]:
    job.model.eval()
    logits = job.model(job.x, job.ctx)
    if job.data.metric == "acc" and job.data.task_type == "multiclass":
        pred = logits.argmax(dim=1)
        counts = torch.tensor([[float((pred[r] == job.y[r]).sum()), float(len(r))] for r in job.local_split.values()],
                              dtype=torch.float64, device=logits.device)
        counts = job.comm.all_reduce(counts)
        return {name: float(c / t) if t else float("nan") for name, (c, t) in zip(SPLITS, counts.tolist())}
    return _gathered_metric(job, logits)


def _gathered_metric(job: Job, logits: torch.Tensor) -> dict[str, float]:
    """ROC-AUC (and OGB's evaluator) need every score: gather them to every rank."""
    scores = logits if job.data.task_type == "multiclass" else torch.sigmoid(logits)
    full = job.comm.all_gather_rows(scores.to(job.comm.device).contiguous(), ALLREDUCE).cpu().numpy()
    labels = np.asarray(job.data.labels)
    out = {}
    for name in SPLITS:
        ids = np.asarray(job.data.splits[name], dtype=np.int64)
        pred = full[ids].argmax(1) if job.data.metric == "acc" else full[ids]
        out[name] = compute_metric(job.data.metric, labels[ids], pred, job.data.ogb_name)
    return out


# -- the loop ---------------------------------------------------------------------------------------------------------
def fit(job: Job) -> dict:
    """Train for cfg.epochs (or until early stopping); returns the final record."""
    cfg, env = job.cfg, job.env
    start = _maybe_resume(job)
    writer = ResultsWriter(cfg.results if env.is_main else None, job.history)
    stale = 0
    for epoch in range(start, cfg.epochs):
        if epoch == cfg.fail_at_epoch and env.rank == cfg.fail_rank:
            raise TrainingError(f"injected failure on rank {env.rank} at epoch {epoch} (--fail-rank/--fail-at-epoch)")
        job.comm.stats.reset()
        reset_peak_memory(env.device)
        job.ctx.reset_stats()
        t0, cpu0 = time.perf_counter(), time.process_time()
        loss = train_step(job, epoch)
        epoch_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        if not np.isfinite(loss):
            raise TrainingError(f"loss became {loss} at epoch {epoch}; lower --lr (now {cfg.lr}) or check the "
                                f"store's features for NaN/inf (`ntp data info {cfg.store}`)")
        worker = {**worker_record(env.rank, epoch_s, job.comm.stats, env.device), **job.ctx.worker_stats(),
                  "cpu_s": cpu_s}  # CPU seconds of all this process's threads (compute and communication)
        metrics = {}
        if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
            metrics = evaluate_splits(job)
            stale = 0 if _update_best(job, epoch, metrics) else stale + 1
        workers = all_gather_objects(env, worker)
        rec = {"epoch": epoch, "loss": loss, "train_metric": metrics.get("train"), "valid_metric": metrics.get("valid"),
               "test_metric": metrics.get("test"), "epoch_s": epoch_s, "workers": workers}
        writer.write(rec)
        if cfg.checkpoint_dir and env.is_main and ((epoch + 1) % cfg.checkpoint_every == 0 or epoch == cfg.epochs - 1):
            checkpoint.save_checkpoint(cfg.checkpoint_dir, epoch, _state(job))
        if cfg.patience and stale >= cfg.patience:
            break
    final = {"final": True, "best_epoch": job.best["epoch"], "best_valid_metric": job.best["valid"],
             "test_metric": job.best["test"], "metric": job.data.metric, "world_size": env.world,
             "store_fingerprint": job.data.fingerprint, "config": cfg.to_dict()}
    writer.write(final)
    if env.is_main:
        if cfg.model_out:
            save_model(job, cfg.model_out)
        print(summary_table(job.history), flush=True)
    return final


def _update_best(job: Job, epoch: int, metrics: dict[str, float]) -> bool:
    valid = metrics["valid"]
    if np.isnan(valid) or valid <= job.best["valid"]:
        return False
    job.best.update(epoch=epoch, valid=valid, test=metrics["test"],
                    state=copy.deepcopy({k: v.detach().cpu() for k, v in job.model.state_dict().items()}))
    return True


def _state(job: Job) -> dict:
    return {"model": job.model.state_dict(), "optimizer": job.optimizer.state_dict(), "best": job.best,
            "history": job.history, "config": job.cfg.to_dict()}


def _maybe_resume(job: Job) -> int:
    if not job.cfg.resume:
        return 0
    path = checkpoint.latest_checkpoint(job.cfg.checkpoint_dir)
    if path is None:
        return 0  # nothing to resume from yet: a fresh start
    state = checkpoint.load(path, job.env.device)
    job.model.load_state_dict(state["model"])
    job.optimizer.load_state_dict(state["optimizer"])
    job.best = state["best"]
    job.history[:] = state["history"]
    return int(state["epoch"]) + 1


def save_model(job: Job, path: str | Path) -> Path:
    """The best model: weights plus what rebuilds it (config, widths, store fingerprint)."""
    state = job.best["state"] or {k: v.detach().cpu() for k, v in job.model.state_dict().items()}
    return checkpoint.atomic_save({"config": job.cfg.to_dict(), "state_dict": state, "in_dim": job.data.feature_dim,
                                   "out_dim": job.data.out_dim, "store_fingerprint": job.data.fingerprint,
                                   "metric": job.data.metric, "best_epoch": job.best["epoch"]}, path)


class ResultsWriter:
    """JSON lines on rank 0: one record per epoch, then the final record. Rewritten from history on resume."""

    def __init__(self, path: str | None, history: list[dict]) -> None:
        self.history = history
        self.file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w")
            for rec in history:
                self._emit(rec)

    def write(self, rec: dict) -> None:
        if "epoch" in rec:
            self.history.append(rec)
        self._emit(rec)

    def _emit(self, rec: dict) -> None:
        if self.file:
            self.file.write(json.dumps(rec) + "\n")
            self.file.flush()


def summary_table(history: list[dict]) -> str:
    """Per-worker compute and communication, like Table 2 of the NeutronTP paper (means over epochs)."""
    if not history:
        return "no epochs run"
    ranks = len(history[0]["workers"])
    compute = [statistics.mean(h["workers"][r]["compute_s"] for h in history) for r in range(ranks)]
    comm = [statistics.mean(sum(h["workers"][r]["comm_s"].values()) for h in history) for r in range(ranks)]
    sent = [statistics.mean(sum(h["workers"][r]["bytes_sent"].values()) for h in history) for r in range(ranks)]
    epoch = statistics.median(h["epoch_s"] for h in history)
    ratio = lambda v: max(v) / min(v) if min(v) > 0 else float("nan")  # noqa: E731
    return "\n".join([
        f"{'workers':>8} {'epoch_s':>9} {'comp max':>9} {'comp min':>9} {'comm max':>9} {'comm min':>9} "
        f"{'MB/rank':>9} {'bytes max/min':>13}",
        f"{ranks:>8} {epoch:>9.4f} {max(compute):>9.4f} {min(compute):>9.4f} {max(comm):>9.4f} {min(comm):>9.4f} "
        f"{statistics.mean(sent) / 1e6:>9.3f} {ratio(sent):>13.2f}",
    ])


def run(cfg: TrainConfig, load: DataLoader | None = None) -> dict:
    """Train on this process (world size from torchrun's environment, else 1)."""
    with distributed(cfg.timeout_s) as env:
        return fit(setup(cfg, env, load))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ntp.train", description=__doc__)
    add_config_arguments(parser)
    return parser


@record
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.mode is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        cfg = cfg.replace(mode="tp")  # several processes and no mode given: tensor parallel
    try:
        run(cfg)
    except BaseException:
        rank = os.environ.get("RANK", "0")
        print(f"{FAILURE_BEGIN} (rank {rank}) =====\n{traceback.format_exc().rstrip()}\n{FAILURE_END} (rank {rank}) =====",
              file=sys.stderr, flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
