"""Benchmark 2: single-process training epoch (forward, backward, Adam step) of 2-layer GCN, GraphSAGE and GAT.

    python bench/epoch.py --quick
    python bench/epoch.py --graphs synthetic cornell5 tolokers --size big --with-dgl

Every system on its best path, timed the same way. ntp runs its own training step (ntp.engine.train.loop.setup +
train_step, --mode single; coupled = the classic GCNConv/SAGEConv/GATConv layers; decoupled = MLP then 2
propagation steps, a different model, timed but not compared). PyG runs GCNConv(cached=True) / SAGEConv / GATConv
on each input it accepts: ``edge_index`` (gather/scatter), a torch.sparse CSR ``adj_t`` and a column-sorted
``EdgeIndex``; a short probe picks the fastest of them for each model, and the row names it. DGL runs GraphConv /
SAGEConv / GATConv on its own graph, in its own environment, as one long-lived process. Then every system gets the
same ``--warmup`` untimed epochs and ``--turns`` turns of ``--per-turn`` timed epochs, the order of the systems
rotating from turn to turn (a shared machine drifts); the figure is the median over turns of each turn's median
epoch, the same statistic for all. Same hidden width, heads, dropout rate (``--dropout``, 0.5 by default), threads
and allocator; features of the store (synthetic: 128 wide). ``--dropout-shares`` adds ntp's coupled epoch with
dropout by its C kernel, by torch's ops (NTP_NATIVE=0) and at rate 0, in turns: dropout's share of the epoch.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import (
    add_graph_arguments,
    add_single_process_arguments,
    alternating_turns,
    base_parser,
    dgl_server,
    graph_selection,
    graph_stores,
    in_process,
    load_arrays,
    report,
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


#: PyG's inputs, gather/scatter first; the fastest one that runs is used for each model
PYG_PATHS = ("edge_index", "adj_t", "EdgeIndex")


def pyg_graph(a: dict, path: str):
    """The graph as PyG's layers take it on ``path``: the store's CSR is by destination, sources in ``indices``."""
    n = len(a["indptr"]) - 1
    indptr, src = torch.from_numpy(a["indptr"]), torch.from_numpy(a["indices"])
    if path == "adj_t":
        with warnings.catch_warnings():  # torch's notes that sparse CSR is in beta and unchecked
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(indptr, src, torch.ones(len(src)), (n, n))
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    ei = torch.stack([src, dst])
    if path == "EdgeIndex":
        from torch_geometric import EdgeIndex

        return EdgeIndex(ei, sparse_size=(n, n), sort_order="col")
    return ei


def pyg_step(a: dict, model: str, hidden: int, heads: int, dropout: float, path: str):
    """One PyG training epoch of ``model`` on ``path``, as a call."""
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    g = pyg_graph(a, path)
    x, y, train = torch.from_numpy(a["x"]), torch.from_numpy(a["y"]), torch.from_numpy(a["train"])
    train = train[y[train] >= 0]
    torch.manual_seed(0)
    act = F.relu
    if model == "gcn":
        layers = [GCNConv(x.shape[1], hidden, cached=True), GCNConv(hidden, a["classes"], cached=True)]
    elif model == "sage":
        layers = [SAGEConv(x.shape[1], hidden), SAGEConv(hidden, a["classes"])]
    else:
        layers = [GATConv(x.shape[1], hidden // heads, heads), GATConv(hidden // heads * heads, a["classes"], 1)]
        act = F.elu
    layers = torch.nn.ModuleList(layers)
    opt = torch.optim.Adam(layers.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        h = act(layers[0](F.dropout(x, dropout), g))
        out = layers[1](F.dropout(h, dropout), g)
        F.cross_entropy(out[train], y[train]).backward()
        opt.step()

    return step


def pyg_best(a: dict, model: str, hidden: int, heads: int, dropout: float, probe: int):
    """(path, its step, {path: probe seconds or the error}): each path's best of ``probe`` epochs after one."""
    probes, best = {}, None
    for path in PYG_PATHS:
        try:
            step = pyg_step(a, model, hidden, heads, dropout, path)
            seconds = min(time_median(step, probe)[1])
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
            probes[path] = f"fails: {str(exc).splitlines()[0][:80]}"
            continue
        probes[path] = round(seconds, 5)
        if best is None or seconds < best[2]:
            best = (path, step, seconds)
    if best is None:
        raise RuntimeError(f"PyG ran {model} on none of its inputs: {probes}")
    return best[0], best[1], probes


def dgl_npz(a: dict, folder: str) -> str:
    npz = Path(folder) / "g.npz"
    train = a["train"][a["y"][a["train"]] >= 0]
    np.savez(npz, indptr=a["indptr"], indices=a["indices"], x=a["x"], y=np.maximum(a["y"], 0), train=train)
    return str(npz)


def measure(a: dict, store: Path, model: str, args, threads: int, dgl_py) -> dict:
    """One graph and model: every system's turn function, then the same turns for all."""
    hidden, heads, rate = args.hidden, args.heads, args.dropout
    path, pyg, probes = pyg_best(a, model, hidden, heads, rate, args.probe)
    systems = {
        "ntp_coupled": in_process(ntp_job(store, model, "coupled", hidden, heads, threads, rate)[1]),
        "pyg": in_process(pyg),
    }
    if args.decoupled:
        systems["ntp_decoupled"] = in_process(ntp_job(store, model, "decoupled", hidden, heads, threads, rate)[1])
    row = {"pyg_path": path, "pyg_probe_s": probes}
    with contextlib.ExitStack() as stack:
        if dgl_py is not None:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            payload = {"task": "epoch", "npz": dgl_npz(a, folder), "model": model, "hidden": hidden, "heads": heads}
            payload |= {"dropout": rate, "classes": a["classes"], "threads": threads}
            systems["dgl"] = stack.enter_context(dgl_server(dgl_py, "dgl_worker.py", payload))
        timed = alternating_turns(systems, args.warmup, args.turns, args.per_turn)
    return row | {f"{name}_s": seconds for name, seconds in timed.items()}


def main() -> None:
    p = base_parser(__doc__, repeats=True)
    add_graph_arguments(p)
    p.add_argument("--models", nargs="+", default=["gcn", "sage", "gat"], choices=["gcn", "sage", "gat"])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument(
        "--dropout",
        type=float,
        default=0.5,
        help="every framework's dropout rate (ntp's CPU masks read 1 random bit an element at 0.5, 8 where "
        "rate * 256 is whole, else 16)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed epochs of every system before the turns")
    p.add_argument("--turns", type=int, default=None, help="turns of every system, order rotating (default 5, quick 3)")
    p.add_argument("--per-turn", type=int, default=3, help="timed epochs of a system in one turn")
    p.add_argument("--probe", type=int, default=2, help="epochs of each PyG input that pick its fastest")
    p.add_argument("--decoupled", action="store_true", help="time ntp's decoupled model too (not compared)")
    p.add_argument("--dropout-shares", action="store_true", help="also measure dropout's share of ntp's epoch")
    add_single_process_arguments(p)
    args = p.parse_args()
    size, graphs = graph_selection(args, full_size="big")
    repeats, threads, dgl_py, dgl_note = single_process_settings(args)
    args.turns = args.turns or repeats
    rows = []
    for gname, store in graph_stores(graphs, size).items():
        a = load_arrays(store)
        for model in args.models:
            row = {"graph": gname, "model": model, "nodes": len(a["indptr"]) - 1, "edges": len(a["indices"])}
            row |= {"hidden": args.hidden, "threads": threads}
            row |= measure(a, store, model, args, threads, dgl_py)
            for peer in ("pyg", "dgl"):
                if row.get(f"{peer}_s"):
                    row[f"{peer}/ntp_coupled"] = row[f"{peer}_s"] / row["ntp_coupled_s"]
            if args.dropout_shares:
                row |= dropout_shares(store, model, args.hidden, args.heads, threads, repeats, args.dropout)
            rows.append(row)
            print(row, flush=True)
    columns = ["graph", "model", "nodes", "edges", "threads", "ntp_coupled_s", "pyg_path", "pyg_s", "dgl_s"]
    columns += ["pyg/ntp_coupled", "dgl/ntp_coupled", "pyg_probe_s"]
    params = {"size": size, "hidden": args.hidden, "heads": args.heads, "dropout": args.dropout, "threads": threads}
    params |= {"warmup": args.warmup, "turns": args.turns, "per_turn": args.per_turn, "probe": args.probe}
    params |= {"statistic": "median over turns of the turn's median epoch", "dgl": dgl_note}
    report("epoch", rows, params | {"allocator": args.allocator}, columns)


if __name__ == "__main__":
    main()
