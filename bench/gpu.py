"""Benchmark: scale on one machine. ntp (real torchrun jobs) against PyTorch Geometric's best full-graph path, with
memory per edge, start-up time and the budget and offload variants.

    python bench/gpu.py                       # on a GPU machine: products-scale (2.4M nodes, 120M edges) and larger
    python bench/gpu.py --device cpu --size small --nproc 2    # anywhere: 200k nodes, 20M edges, 2 CPU ranks
    python bench/gpu.py --size products --budget 4GB 12GB    # the budget and offload rows once per budget
    python bench/gpu.py --plan                # bench/plan.py: papers100M and MAG240M-sized plans

Rows: ntp's variants (coupled and decoupled GCN, SAGE, GAT; a memory budget, offloaded topology, offloaded
topology and embeddings: these once per ``--budget``, and a budget the memory plan refuses is a row with its
message), then PyG's GCNConv (cached) on a sparse ``adj_t`` (its best path at this scale) in a separate process on
the same device. Columns: epoch seconds (median after a warm-up epoch), peak device memory per
rank, host memory of the whole node (PSS summed over its ranks: pages the ranks share count once) per edge, the
topology's bytes per edge (host, and device-resident), and start-up (reading and preparing the topology) against
PyG's loader on the same store. Printed, saved under bench/out/ and logged to MLflow (experiment "benchmarks").
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
from common import OUT, base_parser, report, synthetic_store
from runs import run_job

#: (nodes, average in-degree, features) per size; "products" is ogbn-products' scale, "papers-slice" is sized for
#: an 80 GB GPU with one rank
SIZES = {
    "tiny": (20_000, 10, 32),
    "small-sparse": (200_000, 25, 100),
    "small": (200_000, 100, 100),
    "products": (2_400_000, 50, 100),
    "large": (6_000_000, 50, 128),
}
VARIANTS = {
    "gcn coupled": dict(model="gcn", arch="coupled"),
    "gcn decoupled": dict(model="gcn", arch="decoupled", nn_layers=2, prop_steps=2),
    "sage coupled": dict(model="sage", arch="coupled"),
    "gat coupled": dict(model="gat", arch="coupled", heads=4),
    "gcn --dropout 0": dict(model="gcn", arch="coupled", dropout=0.0),
    "gcn --precision bf16": dict(model="gcn", arch="coupled", precision="bf16"),
    "gcn --memory-budget": dict(model="gcn", arch="coupled", memory_budget="BUDGET"),
    "gcn --offload topology": dict(model="gcn", arch="coupled", memory_budget="BUDGET", offload="topology"),
    "gcn --offload all": dict(model="gcn", arch="coupled", memory_budget="BUDGET", offload="all"),
    # the NN stage on the host: one rank's column slice is then not its rows, and --offload all streams it
    "gcn --nn-device cpu": dict(model="gcn", arch="coupled", nn_device="cpu"),
    "gcn --offload all --nn-device cpu": dict(
        model="gcn", arch="coupled", memory_budget="BUDGET", offload="all", nn_device="cpu"
    ),
    # the NN stage streamed through the GPU in row blocks, its rows in host memory (ntp.engine.parallel.row_stream)
    "gcn --nn-device stream": dict(model="gcn", arch="coupled", nn_device="stream"),
    "gcn --offload topology --nn-device stream": dict(
        model="gcn", arch="coupled", memory_budget="BUDGET", offload="topology", nn_device="stream"
    ),
    "gcn --offload all --nn-device stream": dict(
        model="gcn", arch="coupled", memory_budget="BUDGET", offload="all", nn_device="stream"
    ),
    "gcn --offload all --nn-device stream --precision bf16": dict(
        model="gcn", arch="coupled", memory_budget="BUDGET", offload="all", nn_device="stream", precision="bf16"
    ),
}


def ntp_row(store: Path, name: str, fields: dict, args) -> dict:
    """One ntp variant; a memory budget the plan refuses is a row too (its message says what would fit)."""
    from ntp.errors import MemoryPlanError

    try:
        res = run_job(
            store,
            args.nproc,
            args.epochs,
            **{"hidden": args.hidden, "dropout": 0.5, "mode": "tp", "device": args.device, **fields},
        )
    except MemoryPlanError as exc:
        return {"variant": f"ntp {name}", "note": f"refused before training: {exc}"}
    edges = res["edges"]
    beyond = res["host_pss_node"] - _feature_bytes(store) - args.nproc * args.baseline
    return {
        "variant": f"ntp {name}",
        "epoch_s": res["epoch_s"],
        "peak_GB_per_rank": res["peak_mem_max"] / 1e9,
        "peak_nn_GB": res["peak_mem_by_phase"].get("nn", 0) / 1e9,  # where the peak is: rows or propagation
        "peak_propagate_GB": res["peak_mem_by_phase"].get("propagate", 0) / 1e9,
        "host_B_per_edge": res["host_pss_node"] / edges,
        "host_net_B_per_edge": beyond / edges,
        "topology_B_per_edge": res["topology_bytes"] / edges,
        "device_topology_B_per_edge": res["device_topology_bytes"] / edges,
        "chunks": res["chunks"],
        "nn_device": res["nn_device"],
    }


def expand_budgets(variants: list[str], budgets: list[str]) -> list[tuple[str, dict]]:
    """(label, fields) per row: a variant that takes the memory budget runs once per budget."""
    rows = []
    for name in variants:
        fields = VARIANTS[name]
        if "BUDGET" not in fields.values():
            rows.append((name, fields))
            continue
        for budget in budgets:
            rows.append((f"{name} {budget}", {k: (budget if v == "BUDGET" else v) for k, v in fields.items()}))
    return rows


def _feature_bytes(store: Path) -> int:
    from storage import open_store

    meta = open_store(store).meta
    return meta.num_nodes * meta.feature_dim * 4


def baseline_pss() -> int:
    """PSS of a process that imported torch and the engine: the fixed cost every rank pays, whatever the graph."""
    import subprocess
    import sys

    code = (
        "import torch, ntp.engine.train.loop, ntp.engine.train.setup; from ntp.engine.device.measure import host_pss_bytes; "
        "print(host_pss_bytes())"
    )
    return int(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout.split()[-1]
    )


# -- PyG, in its own process (its memory is its own) ------------------------------------------------------------------
def _pyg_worker(store: str, device: str, hidden: int, epochs: int, queue) -> None:
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    from ntp.engine.device.measure import _vm_hwm
    from storage import open_store

    t0 = time.perf_counter()
    s = open_store(store)  # what a PyG user does: the CSR into an adj_t (rows: destinations), features, labels
    indptr, indices = torch.from_numpy(s.indptr()), torch.from_numpy(s.indices().astype(np.int64))
    n = indptr.numel() - 1
    adj_t = torch.sparse_csr_tensor(indptr, indices, torch.ones(indices.numel()), size=(n, n))
    x, y = torch.from_numpy(s.features()), torch.from_numpy(s.labels())
    train = torch.from_numpy(s.split("train"))
    startup = time.perf_counter() - t0
    dev = torch.device(device)
    x, y, adj_t, train = x.to(dev), y.to(dev), adj_t.to(dev), train.to(dev)
    train = train[y[train] >= 0]
    layers = torch.nn.ModuleList(
        [GCNConv(x.shape[1], hidden, cached=True), GCNConv(hidden, int(y.max()) + 1, cached=True)]
    ).to(dev)
    opt = torch.optim.Adam(layers.parameters(), lr=0.01)
    times = []
    for _ in range(epochs):
        t = time.perf_counter()
        opt.zero_grad()
        h = F.relu(layers[0](F.dropout(x, 0.5), adj_t))
        F.cross_entropy(layers[1](F.dropout(h, 0.5), adj_t)[train], y[train]).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else _vm_hwm()
    queue.put(
        {"epoch_s": float(np.median(times[1:] or times)), "peak": int(peak), "startup_s": startup, "host": _vm_hwm()}
    )


def pyg_row(store: Path, args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_pyg_worker, args=(str(store), args.device, args.hidden, args.epochs, queue))
    proc.start()
    try:
        res = queue.get(timeout=1800)
    except Exception:
        return {"variant": "PyG GCNConv adj_t", "note": "failed or out of memory"}
    finally:
        proc.join(60)
    edges = _edges(store)
    return {
        "variant": "PyG GCNConv adj_t",
        "epoch_s": res["epoch_s"],
        "peak_GB_per_rank": res["peak"] / 1e9,
        "host_B_per_edge": res["host"] / edges,
        "startup_s": res["startup_s"],
    }


# -- start-up: reading and preparing the topology -----------------------------------------------------------------------
def ntp_startup(store: Path) -> float:
    from ntp.engine.graph.data import store_topology
    from storage import open_store

    t0 = time.perf_counter()
    store_topology(open_store(store))
    return time.perf_counter() - t0


def _edges(store: Path) -> int:
    from storage import open_store

    return open_store(store).meta.num_edges


def main() -> None:
    p = base_parser(__doc__, threads=False)
    p.add_argument("--device", default=None, choices=["cuda", "cpu"], help="default: cuda where there is one")
    p.add_argument(
        "--size",
        nargs="+",
        default=None,
        choices=list(SIZES),
        help="graphs (default: products and large on CUDA, small on CPU; --quick: tiny)",
    )
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: the GPUs, or 2 on CPU)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="VARIANT")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument(
        "--budget",
        nargs="+",
        default=["2GB"],
        help="--memory-budget of the budget and offload variants; each runs once per budget (a budget "
        "the plan refuses is reported as a row with the plan's message)",
    )
    p.add_argument("--no-pyg", action="store_true")
    p.add_argument("--plan", action="store_true", help="print the largest graphs' plan (bench/plan.py) and stop")
    args = p.parse_args()
    if args.plan:
        return print_plan()
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.nproc = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 2)
    args.baseline = baseline_pss()
    sizes = args.size or (
        ["tiny"] if args.quick else ["products", "large"] if args.device == "cuda" else ["small-sparse", "small"]
    )
    if args.quick:
        args.epochs, args.variants = 3, ["gcn coupled", "gcn --memory-budget", "gcn --offload all"]
        args.budget = ["64MB"]
    rows = []
    for size in sizes:
        nodes, degree, features = SIZES[size]
        store = synthetic_store(nodes, degree, features=features)
        edges = _edges(store)
        startup = ntp_startup(store)
        for i, (name, fields) in enumerate(expand_budgets(args.variants, args.budget)):
            row = {
                "graph": f"{size} ({nodes / 1e6:g}M nodes, {edges / 1e6:.0f}M edges)",
                "nodes": nodes,
                "edges": edges,
                **ntp_row(store, name, fields, args),
            }
            if i == 0:
                row["startup_s"] = startup
            rows.append(row)
            print(row, flush=True)
        if not args.no_pyg:
            rows.append({"graph": rows[-1]["graph"], "edges": edges, **pyg_row(store, args)})
            print(rows[-1], flush=True)
        base = next(
            (
                r
                for r in rows
                if r["graph"] == rows[-1]["graph"] and r["variant"].startswith("ntp ") and r.get("epoch_s")
            ),
            None,
        )
        for r in rows:
            if base and r["graph"] == base["graph"] and r.get("epoch_s"):
                r["x_first_variant"] = r["epoch_s"] / base["epoch_s"]
    report(
        f"gpu-{args.device}",
        rows,
        {
            "device": args.device,
            "nproc": args.nproc,
            "epochs": args.epochs,
            "hidden": args.hidden,
            "budget": args.budget,
            "sizes": sizes,
        },
    )
    keep_measured(_measured(rows))
    print_plan()


def keep_measured(measured: dict | None) -> None:
    """Keep the bytes per edge for the plan from the largest graph measured yet: on a small graph the per-vertex
    and per-process costs dominate (a --quick run gives hundreds of bytes per edge). A run without the coupled GCN
    row keeps the last figures."""
    path = OUT / "bytes_per_edge.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if measured and measured["edges"] >= kept.get("edges", 0):
        path.write_text(json.dumps(measured))
    elif measured:
        print(f"the plan of the largest graphs keeps the figures of {kept['graph']}, a larger graph than this run's")


def _measured(rows: list[dict]) -> dict | None:
    """Bytes per edge for the plan: the slope of the node's host memory between two graphs with the same vertices
    and features but different edge counts (what one more edge costs: per-vertex and per-process costs cancel),
    else the largest graph's net figure; None without a coupled GCN row."""
    ours = [r for r in rows if r["variant"] == "ntp gcn coupled" and "host_B_per_edge" in r]
    if not ours:
        return None
    big = max(ours, key=lambda r: r["edges"])
    measured = {
        "host_B_per_edge": big["host_net_B_per_edge"],
        "topology_B_per_edge": big["topology_B_per_edge"],
        "graph": big["graph"],
        "edges": big["edges"],
    }
    pair = [r for r in ours if r["nodes"] == big["nodes"] and r["edges"] != big["edges"]]
    if pair:
        low = min(pair, key=lambda r: r["edges"])
        slope = (big["host_B_per_edge"] * big["edges"] - low["host_B_per_edge"] * low["edges"]) / (
            big["edges"] - low["edges"]
        )
        measured.update(host_B_per_edge=slope, graph=f"slope between {low['graph']} and {big['graph']}")
    return measured


def print_plan() -> None:
    """The plan of the largest graphs (bench/plan.py), with the bytes per edge kept above."""
    import plan

    plan.main([])


if __name__ == "__main__":
    main()
