"""Benchmark 3: decoupled tensor parallel vs coupled (naive) tensor parallel vs data parallel at 1, 2, 4 ranks.

    python bench/modes.py --quick
    python bench/modes.py --graphs synthetic cornell5 tolokers --size medium --epochs 6

Real torchrun jobs (ntp.run.launch.launch_training, gloo on CPU) of a 2-layer GCN; figures from the results file,
medians over epochs after the first: epoch time, bytes sent per rank (all kinds; "graph" = split+gather+halo),
max/min across ranks of bytes, compute and communication time. Data parallel runs the coupled GCN (the classic
vertex-partitioned baseline, as DistDGL) and, with --data-decoupled, the decoupled model too.
"""

from __future__ import annotations

from common import add_graph_arguments, base_parser, graph_selection, graph_stores, report
from runs import run_job

MODES = {
    "tp-decoupled": dict(mode="tp", arch="decoupled"),
    "tp-coupled": dict(mode="tp", arch="coupled"),
    "data-coupled": dict(mode="data", arch="coupled"),
}


def main() -> None:
    p = base_parser(__doc__)
    add_graph_arguments(p)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--data-decoupled", action="store_true")
    args = p.parse_args()
    size, graphs = graph_selection(args, full_size="medium")
    epochs = args.epochs or (4 if args.quick else 6)
    modes = dict(MODES, **({"data-decoupled": dict(mode="data", arch="decoupled")} if args.data_decoupled else {}))
    rows = []
    for gname, store in graph_stores(graphs, size).items():
        base = {}
        for m in args.ranks:
            for name, fields in modes.items():
                if m == 1 and name.startswith("data"):
                    continue  # one rank: every mode is the single-process model
                r = run_job(
                    store,
                    m,
                    epochs,
                    model="gcn",
                    hidden=args.hidden,
                    nn_layers=2,
                    prop_steps=2,
                    threads=args.threads or 0,
                    **fields,
                )
                row = {"graph": gname, "mode": name if m > 1 else name.replace("tp-", "single-"), "ranks": m, **r}
                row.pop("graph_bytes_per_rank")
                base.setdefault(fields["arch"], row["epoch_s"]) if m == 1 else None
                row["speedup_vs_1"] = base.get(fields["arch"], float("nan")) / row["epoch_s"]
                rows.append(row)
                print(row, flush=True)
    report(
        "modes",
        rows,
        {"size": size, "epochs": epochs, "hidden": args.hidden, "ranks": args.ranks},
        [
            "graph",
            "mode",
            "ranks",
            "epoch_s",
            "speedup_vs_1",
            "MB_per_rank",
            "graph_MB_per_rank",
            "bytes_max/min",
            "compute_max/min",
            "comm_max/min",
            "compute_max_s",
            "comm_max_s",
        ],
    )


if __name__ == "__main__":
    main()
