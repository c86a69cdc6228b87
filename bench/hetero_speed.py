"""R-GCN epoch time and memory: ntp against PyTorch Geometric's RGCNConv and FastRGCNConv on the same graphs and model.

Model (every system): per node type a Linear of its features or a learnable embedding (featureless types; AIFB has
only those: R-GCN's one-hot first layer for ntp, ``RGCNConv(num_nodes, ...)`` with ``x=None`` for PyG), then R-GCN
layers of width ``--hidden`` (mean aggregation, root weight, bias), ReLU between them, cross-entropy on the target
type's training nodes, Adam. One epoch = forward, backward, optimiser step, full graph. Graphs: AIFB (with inverse
relations), IMDB, and a synthetic heterogeneous graph shaped like ogbn-mag (4 node types: paper with 128 features,
author, institution, field without; 4 relations plus their reverses; ``--mag-scale 1.0`` = 1.94M nodes, 21.1M edges
before reverses).

Each (system, graph) runs in its own process (one CPU process, ``--threads`` threads); the table gives the median
epoch time over ``--repeats`` epochs after a warm-up one, and the process's peak RSS (VmHWM). DGL's RelGraphConv runs
in its own environment (torch 2.2, dgl 2.1: bench/common.dgl_python, built by ``--with-dgl``; bench/dgl_rgcn_worker.py)
with edges sorted by relation (its fast path) and a per-relation mean as edge norms. It takes float inputs only, so
it has no row for AIFB's one-hot first layer.

  python bench/hetero_speed.py                         AIFB, IMDB, mag-shaped at 1 %
  python bench/hetero_speed.py --mag-scale 1.0         ogbn-mag scale (several GB per process)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import DATASETS, base_parser, report, time_median

MAG = {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965}
MAG_EDGES = {
    ("author", "affiliated_with", "institution"): 1_043_998,
    ("author", "writes", "paper"): 7_145_660,
    ("paper", "cites", "paper"): 5_416_271,
    ("paper", "has_topic", "field_of_study"): 7_505_078,
}


def mag_like(scale: float, seed: int = 0) -> dict:
    """ogbn-mag's shape at ``scale``: type sizes, relation sizes (sources drawn with a power law), reverses."""
    rng = np.random.default_rng(seed)
    counts = {t: max(int(n * scale), 10) for t, n in MAG.items()}
    edges = {}
    for (s, r, d), e in MAG_EDGES.items():
        e = max(int(e * scale), 10)
        src = np.minimum((rng.pareto(1.5, e) * counts[s] / 20).astype(np.int64), counts[s] - 1)
        edge = np.stack([rng.permutation(counts[s])[src], rng.integers(0, counts[d], e)])
        edges[(s, r, d)], edges[(d, f"rev_{r}", s)] = edge, edge[::-1].copy()
    n = counts["paper"]
    labels = rng.integers(0, 349, n)
    perm = rng.permutation(n)
    splits = {"train": perm[: n // 2], "valid": perm[n // 2 : 3 * n // 4], "test": perm[3 * n // 4 :]}
    features = {"paper": rng.standard_normal((n, 128), dtype=np.float32)}
    return dict(counts=counts, edges=edges, features=features, target="paper", labels=labels, splits=splits)


def real_graph(name: str) -> dict:
    from ntp.engine.tasks.hetero.data import load_hetero
    from storage import prepare

    path = prepare(name, from_dir=DATASETS / "ogb-hetero" / name, add_reverse=name == "aifb", progress=lambda s: None)
    d = load_hetero(str(path), 1, 0)
    edges = {}
    for r in d.relations:
        dst = np.repeat(np.arange(len(r.indptr) - 1), np.diff(r.indptr))
        s, name_, t = r.key.split("___")
        edges[(s, name_, t)] = np.stack([np.asarray(r.indices, np.int64), dst])
    return dict(counts=d.counts, edges=edges, features=d.features, target=d.target, labels=d.labels, splits=d.splits)


def graph(name: str, scale: float) -> dict:
    return mag_like(scale) if name == "mag-like" else real_graph(name)


def ntp_epoch(g: dict, hidden: int, layers: int):
    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.tasks.hetero.data import hetero_from_arrays
    from ntp.engine.train.loop import train_step
    from ntp.engine.train.setup import setup

    classes = int(np.max(g["labels"])) + 1
    data = hetero_from_arrays(
        g["counts"], g["edges"], g["features"], g["target"], g["labels"], g["splits"], num_classes=classes
    )
    cfg = TrainConfig(
        model="rgcn",
        arch="coupled",
        mode="single",
        hidden=hidden,
        nn_layers=layers,
        dropout=0.0,
        threads=torch.get_num_threads(),
    )
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None), lambda c, w, r: data)
    step = iter(range(10**9))
    return lambda: train_step(job, next(step))


def pyg_epoch(g: dict, hidden: int, layers: int, fast: bool):
    from torch_geometric.nn import FastRGCNConv, RGCNConv

    types = list(g["counts"])
    offsets = dict(zip(types, np.cumsum([0] + [g["counts"][t] for t in types]).tolist()))
    keys = list(g["edges"])
    ei = torch.from_numpy(np.concatenate([g["edges"][k] + [[offsets[k[0]]], [offsets[k[2]]]] for k in keys], 1))
    et = torch.from_numpy(np.concatenate([np.full(g["edges"][k].shape[1], i) for i, k in enumerate(keys)]))
    n, classes = sum(g["counts"].values()), int(np.max(g["labels"])) + 1
    conv = FastRGCNConv if fast else RGCNConv
    one_hot = not g["features"]
    inputs = torch.nn.ModuleDict(
        {
            t: (
                torch.nn.Linear(g["features"][t].shape[1], hidden)
                if t in g["features"]
                else torch.nn.Embedding(g["counts"][t], hidden)
            )
            for t in types
        }
    )
    dims = [n if one_hot else hidden] + [hidden] * (layers - (1 if one_hot else 0)) + [classes]
    convs = torch.nn.ModuleList(conv(a, b, len(keys), aggr="mean") for a, b in zip(dims[:-1], dims[1:]))
    params = list(convs.parameters()) + ([] if one_hot else list(inputs.parameters()))
    opt = torch.optim.Adam(params, lr=0.01)
    xs = {t: torch.from_numpy(x) for t, x in g["features"].items()}
    off, cnt = offsets[g["target"]], g["counts"][g["target"]]
    train = torch.from_numpy(np.asarray(g["splits"]["train"], np.int64))
    y = torch.from_numpy(np.asarray(g["labels"], np.int64))[train]

    def epoch():
        opt.zero_grad()
        h = None if one_hot else torch.cat([inputs[t](xs[t]) if t in xs else inputs[t].weight for t in types])
        for i, c in enumerate(convs):
            h = c(h, ei, et)
            h = torch.relu(h) if i < len(convs) - 1 else h
        loss = torch.nn.functional.cross_entropy(h[off : off + cnt][train], y)
        loss.backward()
        opt.step()

    return epoch


def dgl_row(g: dict, hidden: int, layers: int, repeats: int, threads: int) -> dict:
    """DGL's RelGraphConv on ``g`` in the DGL environment (the graph travels as an .npz file)."""
    import tempfile

    from common import dgl_python, run_dgl

    py, why = dgl_python(build=False)
    if py is None:
        return {"note": why}
    if not g["features"]:
        return {"note": "one-hot input (no features): RelGraphConv takes float features only"}
    types, keys = list(g["counts"]), list(g["edges"])
    offsets = dict(zip(types, np.cumsum([0] + [g["counts"][t] for t in types]).tolist()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.npz"
        np.savez(
            path,
            types=np.array(types),
            counts=np.array([g["counts"][t] for t in types]),
            src=np.concatenate([g["edges"][k][0] + offsets[k[0]] for k in keys]),
            dst=np.concatenate([g["edges"][k][1] + offsets[k[2]] for k in keys]),
            etype=np.concatenate([np.full(g["edges"][k].shape[1], i) for i, k in enumerate(keys)]),
            num_rels=len(keys),
            classes=int(np.max(g["labels"])) + 1,
            target=g["target"],
            labels=np.asarray(g["labels"]),
            train=np.asarray(g["splits"]["train"]),
            **{f"x_{t}": x for t, x in g["features"].items()},
        )
        out = run_dgl(
            py,
            "dgl_rgcn_worker.py",
            {
                "npz": str(path),
                "hidden": hidden,
                "layers": layers,
                "repeats": repeats,
                "threads": threads,
                "errors_to_note": True,
            },
        )
    failed = re.search(r"allocate (\d+) bytes", out.get("note", ""))
    if failed:
        return {"note": f"out of memory: an allocation of {int(failed[1]) / 2**30:.1f} GiB (per-edge messages) failed"}
    return out


def measure(system: str, name: str, scale: float, hidden: int, layers: int, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    g = graph(name, scale)
    edges = sum(e.shape[1] for e in g["edges"].values())
    row = {
        "graph": name,
        "system": system,
        "nodes": sum(g["counts"].values()),
        "edges": edges,
        "relations": len(g["edges"]),
    }
    if system == "dgl":
        return {**row, **dgl_row(g, hidden, layers, repeats, threads)}
    fn = ntp_epoch(g, hidden, layers) if system == "ntp" else pyg_epoch(g, hidden, layers, system == "pyg-fast")
    setup_s = time.perf_counter() - t0
    epoch_s, _ = time_median(fn, repeats)
    peak = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))) * 1024
    return {**row, "epoch_s": epoch_s, "setup_s": setup_s, "peak_rss_mb": peak / 2**20}


def cap_memory() -> int:
    """Cap this process's address space at what the machine has free (plus what it maps already), so a system that
    needs more fails with an allocation error instead of waking the OOM killer; returns the cap in bytes."""
    import resource

    meminfo = lambda f, key: int(next(ln.split()[1] for ln in open(f) if ln.startswith(key))) * 1024  # noqa: E731
    cap = int(0.9 * meminfo("/proc/meminfo", "MemAvailable")) + meminfo("/proc/self/status", "VmSize")
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return cap


SYSTEMS = {
    "ntp": "ntp R-GCN (typed CSR)",
    "pyg": "PyG RGCNConv",
    "pyg-fast": "PyG FastRGCNConv",
    "dgl": "DGL RelGraphConv",
}


def main() -> None:
    p = base_parser(__doc__, repeats=True)
    p.add_argument("--graphs", nargs="+", default=["aifb", "imdb", "mag-like"])
    p.add_argument("--mag-scale", type=float, default=0.01)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per (system, graph) process")
    p.add_argument("--with-dgl", action="store_true", help="build DGL's environment if it is missing")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--one", nargs=2, metavar=("SYSTEM", "GRAPH"), help=argparse_hide())
    args = p.parse_args()
    threads, repeats = args.threads or torch.get_num_threads(), args.repeats or (2 if args.quick else 5)
    if args.one:
        cap = cap_memory()
        try:
            row = measure(*args.one, args.mag_scale, args.hidden, args.layers, repeats, threads)
        except (MemoryError, RuntimeError) as exc:
            if "alloc" not in str(exc) and not isinstance(exc, MemoryError):
                raise
            row = {"graph": args.one[1], "system": args.one[0], "note": f"out of memory ({cap / 2**30:.0f} GiB cap)"}
        print(json.dumps(row))
        return
    if args.with_dgl:
        from common import dgl_python

        print("DGL:", dgl_python(build=True)[1], flush=True)
    rows = []
    for name in args.graphs:
        for system in args.systems:
            cmd = [
                sys.executable,
                str(Path(__file__)),
                "--one",
                system,
                name,
                "--mag-scale",
                str(args.mag_scale),
                "--hidden",
                str(args.hidden),
                "--layers",
                str(args.layers),
                "--repeats",
                str(repeats),
                "--threads",
                str(threads),
            ]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                row = (
                    json.loads(out.stdout.strip().splitlines()[-1])
                    if out.returncode == 0
                    else {
                        "graph": name,
                        "system": system,
                        "note": (out.stderr.strip().splitlines() or ["failed"])[-1][:120],
                    }
                )
            except subprocess.TimeoutExpired:
                row = {"graph": name, "system": system, "note": f"no epoch within {args.timeout:.0f} s"}
            row["system"] = SYSTEMS[system]
            rows.append(row)
            print(row, flush=True)
    report(
        "hetero_speed",
        rows,
        {
            "hidden": args.hidden,
            "layers": args.layers,
            "mag_scale": args.mag_scale,
            "threads": threads,
            "repeats": repeats,
        },
        ["graph", "system", "nodes", "edges", "relations", "epoch_s", "peak_rss_mb", "setup_s", "note"],
    )


def argparse_hide() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
