"""Full graph or sampling? Validation accuracy against training time: ntp (tensor parallel, full graph) and
mini-batch GraphSAGE on sampled neighbourhoods (PyG's ``NeighborLoader`` and DGL's ``NeighborSampler``), on the same
store.

    python bench/time_to_accuracy.py --quick --with-dgl            # Cora and a 20k-vertex planted graph
    python bench/time_to_accuracy.py --with-dgl                    # real graphs + 200k-vertex planted graph
    python bench/time_to_accuracy.py --graphs planted --planted-nodes 2400000 --device cuda   # products scale

Every system trains the same model: 3 GraphSAGE layers (mean), hidden 256, dropout 0.5, as PyG's OGB products
example; each with its own kind of optimiser settings (ntp: full-graph Adam lr 0.01; mini-batch: Adam lr 0.003,
fan-outs 15, 10, 5, batches of 1024 training vertices, as PyG's examples/ogbn_products_sage.py, for both samplers).
ntp runs ``ntp train --mode tp --nproc 2`` (torchrun, gloo) and evaluates every epoch; the mini-batch systems
get as much training time as ntp's epochs took on that graph (``--minibatch-seconds`` sets it) and evaluate every
``--eval-every`` batches with the whole graph. The time axis is training time only (ntp: the sum of
its epochs; mini-batch: sampling, slicing and training steps), not start-up or evaluation. The table gives, per
system, its best validation accuracy, the test accuracy at that point, and the training time to reach 98 % of the
best validation accuracy any system reached (``--fraction``).

Graphs: Cora, CiteSeer, Amazon Photo and Coauthor CS (../shared/datasets/ogb-layout, symmetrised) and ``planted``,
a planted-partition graph: each vertex draws ``--degree`` / 2 edges, a share ``--homophily`` of them inside its
class; its features are its class's centre plus noise (``--signal``), so neither the features nor the structure
alone recover the labels, and accuracy means something. PyG's sampler needs pyg-lib or torch-sparse (its row is
left out, with the reason, where neither is installed); DGL runs in its own environment (``--with-dgl`` builds it).
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
from common import REPO, _random_splits, _write_edges, base_parser, data_dir, dgl_python, real_store, report, run_dgl

REAL = ("cora", "citeseer", "amazon-photo", "coauthor-cs")
MODEL = {"layers": 3, "hidden": 256, "dropout": 0.5}
MINIBATCH = {"fanouts": [15, 10, 5], "batch_size": 1024, "lr": 0.003}  # PyG's OGB products example


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


# -- mini-batch peers: PyG's NeighborLoader, DGL's NeighborSampler ----------------------------------------------------
def store_arrays(store: Path) -> dict[str, np.ndarray]:
    """The store's CSR of in-neighbours, features, labels and labelled split members, as numpy arrays."""
    from storage import open_store

    s = open_store(store)
    y = np.asarray(s.labels(), np.int64)
    out = {"indptr": np.asarray(s.indptr(), np.int64), "indices": np.asarray(s.indices(), np.int64)}
    out |= {"x": np.asarray(s.features(), np.float32), "y": y}
    for k in ("train", "valid", "test"):
        ids = np.asarray(s.split(k), np.int64)
        out[k] = ids[y[ids] >= 0]
    return out


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


def run_pyg(arrays: dict, epochs: int, seconds: float, lr: float, eval_every: int, device: str, threads: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import GraphSAGE

    torch.set_num_threads(threads)
    a = {k: torch.from_numpy(v) for k, v in arrays.items()}
    indptr, src, y = a["indptr"], a["indices"], a["y"]
    n = len(indptr) - 1
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    data = Data(x=a["x"], edge_index=torch.stack([src, dst]), y=y)
    split = {k: a[k] for k in ("train", "valid", "test")}
    loader = NeighborLoader(
        data,
        num_neighbors=MINIBATCH["fanouts"],
        batch_size=MINIBATCH["batch_size"],
        input_nodes=split["train"],
        shuffle=True,
    )
    torch.manual_seed(0)
    dev = torch.device(device)
    model = GraphSAGE(data.num_features, MODEL["hidden"], MODEL["layers"], int(y.max()) + 1, dropout=0.5).to(dev)
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
        if elapsed >= seconds:
            break
        it = iter(loader)
        while elapsed < seconds:
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


def run_dgl_sampling(
    py: Path, arrays: dict, epochs: int, seconds: float, lr: float, eval_every: int, threads: int
) -> dict:
    """DGL's NeighborSampler and SAGEConv in DGL's own environment (bench/dgl_minibatch_worker.py), same settings."""
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "graph.npz"
        np.savez(npz, **arrays)
        payload = {"npz": str(npz), "epochs": epochs, "seconds": seconds, "lr": lr, "eval_every": eval_every}
        payload["threads"] = threads
        payload |= {"fanouts": MINIBATCH["fanouts"], "batch_size": MINIBATCH["batch_size"], **MODEL}
        out = run_dgl(py, "dgl_minibatch_worker.py", payload)
    if out is None:
        raise RuntimeError("DGL's mini-batch run failed; its error is above")
    return {"curve": [tuple(p) for p in out["curve"]], "test_at": dict(map(tuple, out["test_at"]))} | {
        "batches_per_epoch": out["batches_per_epoch"]
    }


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


def minibatch_peers(args, threads: int) -> dict:
    """The mini-batch systems that can run here: name -> run(store, seconds of training, batches between
    evaluations)."""
    peers, why = {}, sampler_ready()
    if why is None:
        peers["pyg NeighborLoader"] = lambda arrays, seconds, every: run_pyg(
            arrays, args.minibatch_epochs, seconds, args.minibatch_lr, every, args.device, threads
        )
    else:
        print(f"PyG left out: {why}", file=sys.stderr)
    dgl_py, note = dgl_python(args.with_dgl)
    if dgl_py is not None and args.device == "cpu":
        peers["dgl NeighborSampler"] = lambda arrays, seconds, every: run_dgl_sampling(
            dgl_py, arrays, args.minibatch_epochs, seconds, args.minibatch_lr, every, threads
        )
    else:
        print(f"DGL left out: {note if dgl_py is None else 'its environment is CPU-only'}", file=sys.stderr)
    return peers


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
    p.add_argument("--minibatch-epochs", type=int, default=500, help="most passes over the training vertices")
    p.add_argument(
        "--minibatch-seconds",
        type=float,
        default=None,
        help="training time each mini-batch system gets (default: as much as ntp's epochs took on that graph)",
    )
    p.add_argument("--minibatch-lr", type=float, default=MINIBATCH["lr"])
    p.add_argument("--eval-every", type=int, default=None, help="mini-batches between evaluations (default: 8 a pass)")
    p.add_argument("--with-dgl", action="store_true", help="build DGL's environment if needed and run its sampler")
    p.add_argument("--fraction", type=float, default=0.98, help="target: this share of the best validation accuracy")
    p.add_argument("--device", default="cpu", help="cpu or cuda (ntp then runs --nproc 1: one GPU here)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for one ntp job")
    args = p.parse_args()
    args.graphs = args.graphs or (["cora", "planted"] if args.quick else ["planted", *REAL])
    args.planted_nodes = args.planted_nodes or (20_000 if args.quick else 200_000)
    ntp_epochs = args.ntp_epochs or (30 if args.quick else 100)
    threads = args.threads or os.cpu_count() or 1
    peers = minibatch_peers(args, threads)
    if not peers:
        print("error: no mini-batch system can run here (see above)", file=sys.stderr)
        return 2
    rows = []
    for graph, store in stores(args).items():
        ranks = args.ranks if args.device == "cpu" else 1
        runs = {f"ntp tp x{ranks}": run_ntp(store, ntp_epochs, args.ntp_lr, ranks, args.device, args.timeout)}
        arrays = store_arrays(store)  # read once for every mini-batch system
        per_pass = max(1, -(-len(arrays["train"]) // MINIBATCH["batch_size"]))
        every = args.eval_every or max(1, per_pass // 8)
        seconds = args.minibatch_seconds or runs[next(iter(runs))]["curve"][-1][0]
        runs |= {name: run(arrays, seconds, every) for name, run in peers.items()}
        rows += summarise(graph, runs, args.fraction)
        print(rows[-len(runs) :], flush=True)
    columns = ["graph", "system", "best_valid", "test_at_best_valid", "target_valid", "time_to_target_s", "train_s"]
    params = {"ntp_epochs": ntp_epochs, "minibatch_epochs": args.minibatch_epochs, "fraction": args.fraction}
    params["minibatch_seconds"] = args.minibatch_seconds or "as ntp's training time"
    params |= {"device": args.device, "threads": threads, "model": MODEL, "minibatch": MINIBATCH}
    params |= {"ntp_lr": args.ntp_lr, "minibatch_lr": args.minibatch_lr, "ranks": args.ranks}
    report("time_to_accuracy", rows, params, columns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
