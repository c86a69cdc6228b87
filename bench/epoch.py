"""Benchmark 2: single-process training epoch (forward, backward, Adam step) of 2-layer GCN and GAT.

    python bench/epoch.py --quick
    python bench/epoch.py --graphs synthetic cornell5 tolokers --size big --with-dgl

ntp runs its own training step (ntp.engine.train.loop.setup + train_step, --mode single; coupled = the classic GCNConv/GATConv
layers, decoupled = MLP then 2 propagation steps). PyG runs GCNConv(cached=True) / GATConv on edge_index (the way
its examples train full-graph), DGL GraphConv / GATConv in its own environment. Same hidden width, heads, dropout
rate (``--dropout``, 0.5 by default), threads; features of the store (synthetic: 128 wide). ntp's coupled job also
runs with NTP_NATIVE=0 (CPU dropout in torch's ops, without its C kernel) and with its dropouts at rate 0, in turns
with the default: the differences are dropout's share of the epoch with the kernel and with torch's ops.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import (
    add_graph_arguments,
    add_single_process_arguments,
    base_parser,
    graph_selection,
    graph_stores,
    load_arrays,
    report,
    run_dgl,
    single_process_settings,
    time_median,
    torch_ops_dropout,
)


def ntp_job(store: Path, model: str, arch: str, hidden: int, heads: int, threads: int, dropout: float = 0.5):
    """ntp's job on ``store`` and a call that runs its next epoch."""
    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import init_distributed
    from ntp.engine.train.loop import train_step
    from ntp.engine.train.setup import setup

    cfg = TrainConfig(
        store=str(store),
        model=model,
        arch=arch,
        hidden=hidden,
        heads=heads,
        nn_layers=2,
        prop_steps=2,
        dropout=dropout,
        threads=threads,
        mode="single",
    )
    job = setup(cfg, init_distributed(60))
    epoch = iter(range(10**6))
    return job, lambda: train_step(job, next(epoch))


def ntp_epoch(
    store: Path, model: str, arch: str, hidden: int, heads: int, threads: int, repeats: int, dropout: float
) -> float:
    return time_median(ntp_job(store, model, arch, hidden, heads, threads, dropout)[1], repeats)[0]


@contextlib.contextmanager
def no_dropout(model):
    """``model``'s dropouts at rate 0 (the same job, its memory and caches as they are, without dropout)."""
    from ntp.engine.kernels.dropout import RowDropout

    layers = [m for m in model.modules() if isinstance(m, RowDropout)]
    rates = [m.p for m in layers]
    for m in layers:
        m.p = 0.0
    try:
        yield
    finally:
        for m, rate in zip(layers, rates):
            m.p = rate


def dropout_shares(
    store: Path, model: str, hidden: int, heads: int, threads: int, repeats: int, dropout: float
) -> dict:
    """The coupled epoch with dropout by the C kernel (inside the products after it), by torch's ops
    (NTP_NATIVE=0) and without dropout, and dropout's share of the first two: one job, in turns of 5 epochs after
    one to settle, ``repeats`` turns each; a share is the median over turns of the turn's difference from the turn
    without dropout, over the median epoch (a shared box drifts between turns by more than dropout costs). On this
    box (docs/benchmarks.md, section 2) a process's epochs settle fast or about 25 % slower for its whole life,
    dropout's share with them: compare shares across several runs."""
    job, step = ntp_job(store, model, "coupled", hidden, heads, threads, dropout)
    ways = {"kernel": contextlib.nullcontext, "torch_ops": torch_ops_dropout, "none": lambda: no_dropout(job.model)}
    turns: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            with way():
                turns[name].append(time_median(step, 5)[0])

    def share(name: str) -> float:
        extra = statistics.median(t - none for t, none in zip(turns[name], turns["none"]))
        return extra / statistics.median(turns[name])

    return {
        "ntp_coupled_s": statistics.median(turns["kernel"]),
        "ntp_coupled_dropout_share": share("kernel"),
        "ntp_coupled_no_dropout_s": statistics.median(turns["none"]),
        "ntp_coupled_torch_ops_s": statistics.median(turns["torch_ops"]),
        "ntp_coupled_torch_ops_dropout_share": share("torch_ops"),
    }


def pyg_epoch(a: dict, model: str, hidden: int, heads: int, repeats: int, dropout: float) -> float:
    from torch_geometric.nn import GATConv, GCNConv

    n = len(a["indptr"]) - 1
    dst = torch.repeat_interleave(torch.arange(n), torch.from_numpy(np.diff(a["indptr"])))
    ei = torch.stack([torch.from_numpy(a["indices"]), dst])
    x, y, train = torch.from_numpy(a["x"]), torch.from_numpy(a["y"]), torch.from_numpy(a["train"])
    train = train[y[train] >= 0]
    torch.manual_seed(0)
    if model == "gcn":
        layers = torch.nn.ModuleList(
            [GCNConv(x.shape[1], hidden, cached=True), GCNConv(hidden, a["classes"], cached=True)]
        )
        act = F.relu
    else:
        layers = torch.nn.ModuleList(
            [GATConv(x.shape[1], hidden // heads, heads), GATConv(hidden // heads * heads, a["classes"], 1)]
        )
        act = F.elu
    opt = torch.optim.Adam(layers.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        h = act(layers[0](F.dropout(x, dropout), ei))
        out = layers[1](F.dropout(h, dropout), ei)
        F.cross_entropy(out[train], y[train]).backward()
        opt.step()

    return time_median(step, repeats)[0]


def main() -> None:
    p = base_parser(__doc__)
    add_graph_arguments(p)
    p.add_argument("--models", nargs="+", default=["gcn", "gat"])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument(
        "--dropout",
        type=float,
        default=0.5,
        help="every framework's dropout rate (ntp's CPU masks read 1 random bit an element at 0.5, 8 where "
        "rate * 256 is whole, else 16)",
    )
    add_single_process_arguments(p)
    args = p.parse_args()
    size, graphs = graph_selection(args, full_size="big")
    repeats, threads, dgl_py, dgl_note = single_process_settings(args)
    rows = []
    for gname, store in graph_stores(graphs, size).items():
        a = load_arrays(store)
        for model in args.models:
            row = {
                "graph": gname,
                "model": model,
                "nodes": len(a["indptr"]) - 1,
                "edges": len(a["indices"]),
                "hidden": args.hidden,
                "threads": threads,
            }
            row.update(dropout_shares(store, model, args.hidden, args.heads, threads, repeats, args.dropout))
            row["ntp_decoupled_s"] = ntp_epoch(
                store, model, "decoupled", args.hidden, args.heads, threads, repeats, args.dropout
            )
            row["pyg_s"] = pyg_epoch(a, model, args.hidden, args.heads, repeats, args.dropout)
            if dgl_py is not None:
                with tempfile.TemporaryDirectory() as tmp:
                    npz = Path(tmp) / "g.npz"
                    np.savez(
                        npz,
                        indptr=a["indptr"],
                        indices=a["indices"],
                        x=a["x"],
                        y=np.maximum(a["y"], 0),
                        train=a["train"][a["y"][a["train"]] >= 0],
                    )
                    res = run_dgl(
                        dgl_py,
                        "dgl_worker.py",
                        {
                            "task": "epoch",
                            "npz": str(npz),
                            "model": model,
                            "hidden": args.hidden,
                            "heads": args.heads,
                            "dropout": args.dropout,
                            "classes": a["classes"],
                            "threads": threads,
                            "repeats": repeats,
                        },
                    )
                row["dgl_s"] = res["seconds"] if res else None
            row["pyg/ntp_coupled"] = row["pyg_s"] / row["ntp_coupled_s"]
            if row.get("dgl_s"):
                row["dgl/ntp_coupled"] = row["dgl_s"] / row["ntp_coupled_s"]
            rows.append(row)
            print(row, flush=True)
    report(
        "epoch",
        rows,
        {
            "size": size,
            "hidden": args.hidden,
            "heads": args.heads,
            "dropout": args.dropout,
            "repeats": repeats,
            "threads": threads,
            "dgl": dgl_note,
            "allocator": args.allocator,
        },
    )


if __name__ == "__main__":
    main()
