"""Benchmark 4: depth (2, 3, 4 layers) and width (128 to 1024): bytes per rank vs the cost model, and epoch time.

    python bench/depth_width.py --quick
    python bench/depth_width.py --size medium --ranks 4 --layers 2 3 4 --widths 128 256 512 1024

Decoupled: nn_layers = L Linear layers then 2 propagation steps (the split width is the class count, whatever L and
the width are). Coupled: L GCN layers, each split at the narrower of its input and output widths. Data parallel:
the coupled model with halo exchange. "model_MB" is ntp.engine.distributed.cost's prediction for split+gather bytes (tp modes).
"""

from __future__ import annotations

from common import base_parser, graph_stores, report
from runs import run_job


def main() -> None:
    from ntp.engine.distributed import cost
    from storage import open_store

    p = base_parser(__doc__)
    p.add_argument("--graph", default="synthetic")
    p.add_argument("--size", default=None, choices=["quick", "medium", "big"])
    p.add_argument("--ranks", type=int, default=None)
    p.add_argument("--layers", type=int, nargs="+", default=None)
    p.add_argument("--widths", type=int, nargs="+", default=None)
    p.add_argument("--epochs", type=int, default=None)
    args = p.parse_args()
    size = args.size or ("quick" if args.quick else "medium")
    m = args.ranks or (2 if args.quick else 4)
    layers = args.layers or ([2, 4] if args.quick else [2, 3, 4])
    widths = args.widths or ([128, 512] if args.quick else [128, 256, 512, 1024])
    epochs = args.epochs or (3 if args.quick else 4)
    rows = []
    for gname, store in graph_stores([args.graph], size).items():
        meta = open_store(store).meta
        n, classes, features = meta.num_nodes, meta.num_classes, meta.feature_dim
        for L in layers:
            for w in widths:
                for name, fields in (
                    ("tp-decoupled", dict(mode="tp", arch="decoupled")),
                    ("tp-coupled", dict(mode="tp", arch="coupled")),
                    ("data-coupled", dict(mode="data", arch="coupled")),
                ):
                    r = run_job(
                        store,
                        m,
                        epochs,
                        model="gcn",
                        hidden=w,
                        nn_layers=L,
                        prop_steps=2,
                        threads=args.threads or 0,
                        **fields,
                    )
                    if name == "tp-decoupled":
                        model = cost.decoupled_bytes(n, classes, m)
                    elif name == "tp-coupled":
                        model = cost.coupled_bytes(n, [features] + [w] * (L - 1) + [classes], m)
                    else:
                        model = None
                    row = {
                        "graph": gname,
                        "mode": name,
                        "ranks": m,
                        "layers": L,
                        "width": w,
                        "graph_MB": r["graph_MB_per_rank"],
                        "model_MB": model / 1e6 if model is not None else None,
                        "measured/model": (max(r["graph_bytes_per_rank"]) / model) if model else None,
                        "bytes_max/min": r["bytes_max/min"],
                        "epoch_s": r["epoch_s"],
                        "compute_max/min": r["compute_max/min"],
                    }
                    rows.append(row)
                    print(row, flush=True)
    report("depth_width", rows, {"size": size, "ranks": m, "epochs": epochs})


if __name__ == "__main__":
    main()
