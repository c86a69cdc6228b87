"""Full graph or sampling? Validation accuracy against training time: ntp (tensor parallel, full graph) and PyG's
``NeighborLoader`` GraphSAGE (mini-batches of sampled neighbourhoods), on the same store.

    python bench/time_to_accuracy.py --quick                       # Cora and a 20k-vertex planted graph
    python bench/time_to_accuracy.py                               # real graphs + 200k-vertex planted graph
    python bench/time_to_accuracy.py --graphs planted --planted-nodes 2400000 --device cuda   # products scale

Both train the same model: 3 GraphSAGE layers (mean), hidden 256, dropout 0.5, as PyG's OGB products example;
each with its own example's optimiser settings (ntp: full-graph Adam lr 0.01; PyG: Adam lr 0.003, fan-outs 15, 10,
5, batches of 1024 training vertices, as examples/ogbn_products_sage.py). ntp runs ``ntp train --mode tp --nproc 2``
(torchrun, gloo) and evaluates every epoch; PyG evaluates every ``--pyg-eval-every`` batches with the whole graph.
The time axis is training time only (ntp: the sum of its epochs; PyG: sampling, copying and training steps), not
start-up or evaluation. The table gives, per system, its best validation accuracy, the test accuracy at that
point, and the training time to reach 98 % of the better system's best validation accuracy (``--fraction``).

Graphs: Cora, CiteSeer, Amazon Photo and Coauthor CS (../shared/datasets/ogb-layout, symmetrised) and ``planted``,
a planted-partition graph: each vertex draws ``--degree`` / 2 edges, a share ``--homophily`` of them inside its
class; its features are its class's centre plus noise (``--signal``), so neither the features nor the structure
alone recover the labels, and accuracy means something. PyG's sampler needs pyg-lib or torch-sparse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import REPO, _random_splits, _write_edges, base_parser, data_dir, real_store, report

REAL = ("cora", "citeseer", "amazon-photo", "coauthor-cs")
MODEL = {"layers": 3, "hidden": 256, "dropout": 0.5}
PYG_EXAMPLE = {"fanouts": [15, 10, 5], "batch_size": 1024, "lr": 0.003}


# -- the measure ------------------------------------------------------------------------------------------------------
def time_to_target(curves: dict[str, list[tuple[float, float]]], fraction: float = 0.98) -> tuple[float, dict]:
    """The target (``fraction`` of the best validation accuracy any system reached) and, per system, the first
    time its curve of (seconds, validation accuracy) reaches it, or None where it never does."""
    best = max((acc for curve in curves.values() for _, acc in curve), default=float("nan"))
    target = fraction * best
    reached = {}
    for name, curve in curves.items():
        reached[name] = next((t for t, acc in sorted(curve) if acc >= target), None)
    return target, reached


# -- graphs -----------------------------------------------------------------------------------------------------------
def planted_store(nodes: int, classes: int, degree: float, homophily: float, features: int, signal: float) -> Path:
    """A planted-partition graph (see the module's docstring) as an edge-list store, both directions stored."""
    from storage import prepare

    tag = f"planted-{nodes}-{classes}-{degree:g}-{homophily:g}-{features}-{signal:g}"
    work = data_dir() / "bench-inputs" / tag
    if not (work / "done").exists():
        work.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        y = rng.integers(0, classes, nodes)
        members = [np.flatnonzero(y == c) for c in range(classes)]
        per = max(1, round(degree / 2))
        src = np.repeat(np.arange(nodes), per)
        inside = rng.random(len(src)) < homophily
        dst = rng.integers(0, nodes, len(src))
        for c in range(classes):  # inside edges go to a random vertex of the source's class
            pick = inside & (y[src] == c)
            dst[pick] = members[c][rng.integers(0, len(members[c]), pick.sum())]
        keep = src != dst
        src, dst = src[keep], dst[keep]
        _write_edges(work / "edges.parquet", np.concatenate([src, dst]), np.concatenate([dst, src]))
        centres = rng.standard_normal((classes, features)).astype(np.float32)
        x = signal * centres[y] + rng.standard_normal((nodes, features), dtype=np.float32)
        np.save(work / "x.npy", x.astype(np.float32))
        np.save(work / "y.npy", y.astype(np.int64))
        _random_splits(work / "splits", np.arange(nodes), nodes)
        (work / "done").write_text("ok")
    return prepare(
        tag,
        edges=work / "edges.parquet",
        node_features=work / "x.npy",
        labels=work / "y.npy",
        splits=work / "splits",
        dedup=True,
        progress=lambda line: None,
    )


# -- ntp: torchrun, full graph ----------------------------------------------------------------------------------------
def run_ntp(store: Path, epochs: int, lr: float, ranks: int, device: str, timeout: float) -> dict:
    """``ntp train`` in tensor-parallel mode; its curve from the results file (training seconds summed)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        cmd = [sys.executable, "-m", "ntp.run.cli", "train", "--store", str(store), "--mode", "tp"]
        cmd += ["--nproc", str(ranks), "--model", "sage", "--arch", "coupled", "--nn-layers", str(MODEL["layers"])]
        cmd += ["--hidden", str(MODEL["hidden"]), "--dropout", str(MODEL["dropout"]), "--lr", str(lr)]
        cmd += ["--epochs", str(epochs), "--eval-every", "1", "--results", str(results), "--no-track"]
        cmd += ["--device", device]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    curve, test, elapsed = [], {}, 0.0
    for r in records:
        if "epoch_s" not in r:
            continue
        elapsed += r["epoch_s"]
        if r.get("valid_metric") is not None:
            curve.append((elapsed, r["valid_metric"]))
            test[elapsed] = r["test_metric"]
    return {"curve": curve, "test_at": test, "wall_s": wall}


# -- PyG: NeighborLoader mini-batches ---------------------------------------------------------------------------------
def sampler_ready() -> str | None:
    """None when PyG can sample neighbours here, else why not."""
    import torch_geometric.typing as pyg_typing

    if pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE:
        return None
    import torch

    return (
        f"PyG's NeighborLoader needs pyg-lib or torch-sparse; neither is installed for torch {torch.__version__} "
        "(pyg-lib ships wheels only from data.pyg.org, not PyPI; torch-sparse on PyPI is a source package). "
        "Install one (e.g. `pip install torch-sparse` with a compiler, or pyg-lib from data.pyg.org)"
    )


def run_pyg(store: Path, epochs: int, lr: float, eval_every: int, device: str, threads: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import GraphSAGE

    from storage import open_store

    torch.set_num_threads(threads)
    s = open_store(store)
    indptr = torch.from_numpy(np.asarray(s.indptr(), np.int64))
    src = torch.from_numpy(np.asarray(s.indices(), np.int64))
    n = len(indptr) - 1
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    y = torch.from_numpy(np.asarray(s.labels(), np.int64))
    data = Data(x=torch.from_numpy(np.asarray(s.features(), np.float32)), edge_index=torch.stack([src, dst]), y=y)
    split = {k: torch.from_numpy(np.asarray(s.split(k), np.int64)) for k in ("train", "valid", "test")}
    split = {k: v[y[v] >= 0] for k, v in split.items()}
    loader = NeighborLoader(
        data,
        num_neighbors=PYG_EXAMPLE["fanouts"],
        batch_size=PYG_EXAMPLE["batch_size"],
        input_nodes=split["train"],
        shuffle=True,
    )
    torch.manual_seed(0)
    dev = torch.device(device)
    model = GraphSAGE(data.num_features, MODEL["hidden"], MODEL["layers"], s.meta.num_classes, dropout=0.5).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    full_x, full_adj = data.x.to(dev), torch.sparse_csr_tensor(indptr, src, torch.ones(len(src)), (n, n)).to(dev)

    @torch.no_grad()
    def evaluate() -> dict[str, float]:
        model.eval()
        pred = model(full_x, full_adj).argmax(1).cpu()
        model.train()
        return {k: float((pred[v] == y[v]).float().mean()) for k, v in split.items()}

    curve, test, elapsed, batches = [], {}, 0.0, 0
    for _ in range(epochs):
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            if batch is None:
                break
            batch = batch.to(dev)
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
            F.cross_entropy(out, batch.y[: batch.batch_size]).backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            elapsed += time.perf_counter() - t0
            batches += 1
            if batches % eval_every == 0:
                acc = evaluate()
                curve.append((elapsed, acc["valid"]))
                test[elapsed] = acc["test"]
    return {"curve": curve, "test_at": test, "batches_per_epoch": len(loader)}


# -- the table --------------------------------------------------------------------------------------------------------
def summarise(graph: str, runs: dict[str, dict], fraction: float) -> list[dict]:
    curves = {name: run["curve"] for name, run in runs.items()}
    target, reached = time_to_target(curves, fraction)
    rows = []
    for name, run in runs.items():
        at, best = max(run["curve"], key=lambda p: p[1]) if run["curve"] else (None, None)
        rows.append(
            {
                "graph": graph,
                "system": name,
                "best_valid": best,
                "test_at_best_valid": run["test_at"].get(at),
                "target_valid": target,
                "time_to_target_s": reached[name],
                "train_s": run["curve"][-1][0] if run["curve"] else None,
                "curve": [[round(t, 3), round(a, 4)] for t, a in run["curve"]],
            }
        )
    return rows


def stores(args) -> dict[str, Path]:
    out = {}
    for g in args.graphs:
        if g == "planted":
            out[f"planted-{args.planted_nodes}"] = planted_store(
                args.planted_nodes, args.classes, args.degree, args.homophily, args.features, args.signal
            )
        elif g in REAL:
            out[g] = real_store(g)
        else:
            raise SystemExit(f"unknown graph {g!r}; choose from planted, {', '.join(REAL)}")
    return out


def main() -> int:
    p = base_parser(__doc__)
    p.add_argument("--graphs", nargs="+", default=None, help=f"planted and any of {', '.join(REAL)}")
    p.add_argument("--planted-nodes", type=int, default=None, help="planted graph's vertices (default 200000)")
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--degree", type=float, default=20.0, help="planted graph's average degree")
    p.add_argument("--homophily", type=float, default=0.35, help="share of a vertex's edges inside its class")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--signal", type=float, default=0.3, help="class centre's scale against unit noise")
    p.add_argument("--ntp-epochs", type=int, default=None, help="full-graph epochs (default 100, quick 30)")
    p.add_argument("--ntp-lr", type=float, default=0.01)
    p.add_argument("--ranks", type=int, default=2, help="ntp's tensor-parallel ranks")
    p.add_argument("--pyg-epochs", type=int, default=None, help="passes over the training vertices (default 10)")
    p.add_argument("--pyg-lr", type=float, default=PYG_EXAMPLE["lr"])
    p.add_argument("--pyg-eval-every", type=int, default=None, help="batches between evaluations (default: 8 a pass)")
    p.add_argument("--fraction", type=float, default=0.98, help="target: this share of the best validation accuracy")
    p.add_argument("--device", default="cpu", help="cpu or cuda (ntp then runs --nproc 1: one GPU here)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for one ntp job")
    args = p.parse_args()
    args.graphs = args.graphs or (["cora", "planted"] if args.quick else ["planted", *REAL])
    args.planted_nodes = args.planted_nodes or (20_000 if args.quick else 200_000)
    ntp_epochs = args.ntp_epochs or (30 if args.quick else 100)
    pyg_epochs = args.pyg_epochs or (3 if args.quick else 10)
    threads = args.threads or os.cpu_count() or 1
    missing = sampler_ready()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    rows = []
    for graph, store in stores(args).items():
        ranks = args.ranks if args.device == "cpu" else 1
        runs = {f"ntp tp x{ranks}": run_ntp(store, ntp_epochs, args.ntp_lr, ranks, args.device, args.timeout)}
        train = len(np.asarray(__import__("storage").open_store(store).split("train")))
        per_pass = max(1, -(-train // PYG_EXAMPLE["batch_size"]))
        every = args.pyg_eval_every or max(1, per_pass // 8)
        runs["pyg NeighborLoader"] = run_pyg(store, pyg_epochs, args.pyg_lr, every, args.device, threads)
        rows += summarise(graph, runs, args.fraction)
        print(rows[-2:], flush=True)
    columns = ["graph", "system", "best_valid", "test_at_best_valid", "target_valid", "time_to_target_s", "train_s"]
    params = {"ntp_epochs": ntp_epochs, "pyg_epochs": pyg_epochs, "fraction": args.fraction, "device": args.device}
    params |= {"threads": threads, "model": MODEL, "pyg": PYG_EXAMPLE, "ntp_lr": args.ntp_lr, "ranks": args.ranks}
    report("time_to_accuracy", rows, params, columns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
