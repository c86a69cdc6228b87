"""ogbl-ddi epoch time: ntp against PyG running OGB's link-prediction example, same model, data, batch and machine.

PyG side: what OGB's examples/linkproppred/ddi/gnn.py does, on PyG's best path here (no torch_sparse on this
machine: the adjacency as a torch.sparse CSR ``adj_t``; GCNConv cached): learned embeddings, 2 GCNConv or SAGEConv
layers of width 256, the LinkPredictor MLP on h_u * h_v, ``negative_sampling(method='dense')`` per batch, 64 * 1024
positive edges per step (the encoder rerun every step), gradients clipped per group, Adam. Its evaluation scores the
same sets as ntp's (a sample of training edges, valid and test, positives and negatives) in batches of 64 * 1024.
ntp side: the same settings (bench/link_ddi.py's OGB_EXAMPLE) in one process. Each system runs in its own process
with the same threads, one after the other.

  python bench/link_pyg.py                        GCN and GraphSAGE, 2 epochs each, then one evaluation
  python bench/link_pyg.py --steps 3 --epochs 2   epochs of 3 batches (a busy machine)
  python bench/link_pyg.py --quick                GCN, 1 epoch of 2 batches
  python bench/link_pyg.py --device cuda          both on the GPU (the evaluation too)

Prints a table (wall and CPU seconds per training epoch, seconds per evaluation, the training's peak memory: the
GPU's allocator, or the process's resident set on a CPU, and ntp's memory plan for a rank: ntp.engine.tasks.link.memory
and one chunk of propagation; PyG / ntp), saves it under bench/out/ and logs it to MLflow's 'benchmarks' experiment.
CPU seconds count every thread of the process: on a shared machine they move less than wall seconds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

import numpy as np
from common import base_parser, report
from link_ddi import OGB_EXAMPLE, ddi_store

BATCH = OGB_EXAMPLE["link_batch"]
WIDTH = OGB_EXAMPLE["hidden"]


def _pyg_run(store: str, model: str, epochs: int, steps: int, threads: int, device: str, queue) -> None:
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.utils import negative_sampling

    from storage import open_store

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    s = open_store(store)
    indptr, indices = (
        torch.from_numpy(np.asarray(s.indptr(), np.int64)),
        torch.from_numpy(np.asarray(s.indices(), np.int64)),
    )
    n = len(indptr) - 1
    adj_t = torch.sparse_csr_tensor(indptr, indices, torch.ones(len(indices)), size=(n, n)).to(device)
    edge_index = torch.stack([indices, torch.repeat_interleave(torch.arange(n), indptr.diff())]).to(device)
    splits = {
        name: [None if a is None else torch.from_numpy(np.asarray(a, np.int64)).to(device) for a in s.link_split(name)]
        for name in ("train", "valid", "test")
    }
    train = splits["train"][0][: steps * BATCH or None]
    conv = (lambda: GCNConv(WIDTH, WIDTH, cached=True)) if model == "gcn" else (lambda: SAGEConv(WIDTH, WIDTH))
    convs = torch.nn.ModuleList([conv(), conv()])
    emb = torch.nn.Embedding(n, WIDTH)
    torch.nn.init.xavier_uniform_(emb.weight)
    lins = torch.nn.ModuleList([torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, 1)])
    both = torch.nn.ModuleList([convs, lins, emb]).to(device)
    opt = torch.optim.Adam([*convs.parameters(), *emb.parameters(), *lins.parameters()], lr=OGB_EXAMPLE["lr"])
    p = OGB_EXAMPLE["dropout"]

    def encode() -> torch.Tensor:
        x = F.dropout(F.relu(convs[0](emb.weight, adj_t)), p, convs.training)
        return convs[1](x, adj_t)

    def predict(h: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        x = F.dropout(F.relu(lins[0](h[pairs[0]] * h[pairs[1]])), p, lins.training)
        return torch.sigmoid(lins[1](x))

    def train_epoch() -> None:
        pos = train
        for perm in torch.randperm(len(pos), device=device).split(BATCH):
            opt.zero_grad()
            h = encode()
            pos_out = predict(h, pos[perm].t())
            neg = negative_sampling(edge_index, num_nodes=n, num_neg_samples=len(perm), method="dense")
            neg_out = predict(h, neg)
            loss = -torch.log(pos_out + 1e-15).mean() - torch.log(1 - neg_out + 1e-15).mean()
            loss.backward()
            for params in (emb.parameters(), convs.parameters(), lins.parameters()):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()

    @torch.no_grad()
    def evaluate() -> None:
        h = encode()
        sample = splits["train"][0][: len(splits["valid"][0])]
        for pairs in (sample, *splits["valid"], *splits["test"]):
            torch.cat([predict(h, b.t()) for b in pairs.split(BATCH)])

    queue.put(_timed(both.train, train_epoch, both.eval, evaluate, epochs, device))


def _ntp_run(store: str, model: str, epochs: int, steps: int, threads: int, device: str, queue) -> None:
    import torch

    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.train.loop import evaluate_splits, train_step
    from ntp.engine.train.setup import setup

    cfg = TrainConfig(store=store, model=model, seed=0, mode="single", threads=threads, **OGB_EXAMPLE)
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device(device), None))
    job.task.pos["train"] = job.task.pos["train"][: steps * BATCH or None]
    epoch = iter(range(10**6))
    queue.put(
        {
            **_timed(
                lambda: None,
                lambda: train_step(job, next(epoch)),
                lambda: None,
                lambda: evaluate_splits(job),
                epochs,
                device,
                job.ctx.memory.snapshot,
            ),
            "plan_gb": _plan_bytes(job, device) / 1e9,
        }
    )


def _plan_bytes(job, device: str) -> int:
    """What ntp's memory plan gives a rank for this job: its parts and one chunk of propagation (no budget: one)."""
    from ntp.engine.memory.chunks import degree_costs
    from ntp.engine.tasks.link.memory import resident_parts
    from ntp.engine.tasks.link.task import memory_shape

    topo = job.ctx.topology
    parts = resident_parts(job.cfg, **memory_shape(job.data, job.model, 1, device))
    chunk = degree_costs(topo.in_degrees().numpy(), topo.out_degrees().numpy(), job.ctx.slice_width).sum()
    return sum(parts.values()) + int(chunk)


def _timed(train_mode, train_epoch, eval_mode, evaluate, epochs: int, device: str, phase_peaks=dict) -> dict:
    """Wall and CPU seconds (all threads of the process) per epoch (median after the first) and per evaluation, and
    the training's peak memory (the GPU's allocator, or the process's resident set). ``phase_peaks``: ntp's peaks by
    phase (ntp.engine.device.measure.PhaseMemory), which reset the process's peak at every switch, so that read alone
    after training holds only the last phase's (0.11 GB on an H100, where a step gathers two 134 MB ends)."""
    import torch

    from ntp.engine.device.measure import _vm_hwm

    times = []
    for _ in range(epochs):
        train_mode()
        times.append(_clocked(train_epoch, device))
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _vm_hwm()
    peak = max([peak, *phase_peaks().values()])
    eval_mode()
    pick = lambda i: statistics.median(t[i] for t in times[1:] or times)  # noqa: E731
    return {
        "epoch_s": pick(0),
        "epoch_cpu_s": pick(1),
        "epochs_s": [t[0] for t in times],
        "eval_s": _clocked(evaluate, device)[0],
        "peak_gb": peak / 1e9,
    }


def _clocked(fn, device: str) -> tuple[float, float]:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    sync()
    return time.perf_counter() - t0, time.process_time() - c0


def run(target, store: Path, model: str, args) -> dict:
    """``target`` in its own process (its memory and threads are its own)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(
        target=target, args=(str(store), model, args.epochs, args.steps, args.threads, args.device, queue)
    )
    proc.start()
    try:
        return queue.get(timeout=4 * 3600)
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--models", nargs="+", default=["gcn", "sage"], choices=["gcn", "sage"])
    p.add_argument("--epochs", type=int, default=2, help="training epochs per system (the median after the first)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help="batches per epoch (0: all, 17 on ogbl-ddi); fewer when the "
        "machine is busy: the training edges are cut to STEPS batches for both systems",
    )
    args = p.parse_args()
    args.threads = args.threads or os.cpu_count() or 1
    if args.quick:
        args.models, args.epochs, args.steps = ["gcn"], 1, 2
    store = ddi_store()
    rows = []
    for model in args.models:
        ntp, pyg = run(_ntp_run, store, model, args), run(_pyg_run, store, model, args)
        row = {"model": model, "epochs": args.epochs, "steps": args.steps or "all"}
        for key in ("epoch_s", "epoch_cpu_s", "eval_s", "peak_gb"):
            row.update({f"ntp_{key}": ntp[key], f"pyg_{key}": pyg[key], f"pyg/ntp_{key}": pyg[key] / ntp[key]})
        row["ntp_plan_gb"] = ntp["plan_gb"]
        rows.append(
            {
                **row,
                "ntp_epochs_s": [round(t, 3) for t in ntp["epochs_s"]],
                "pyg_epochs_s": [round(t, 3) for t in pyg["epochs_s"]],
            }
        )
        print(rows[-1], flush=True)
    report(
        "link_pyg",
        rows,
        {"epochs": args.epochs, "steps": args.steps, "threads": args.threads, "device": args.device, **OGB_EXAMPLE},
    )


if __name__ == "__main__":
    main()
