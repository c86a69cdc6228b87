"""bf16 against fp32 (``--precision``): test accuracy over seeds, epoch time and peak memory, side by side.

Graphs: Cora, CiteSeer and Amazon Photo in OGB's node layout (../shared/datasets/ogb-layout), symmetrised. Each
(graph, model, precision) trains every seed for ``--epochs`` with evaluation every epoch; the test accuracy is the
one at the best validation epoch (the final record). The issue's goal: bf16 within 0.5 points of fp32.
"""

from __future__ import annotations

import statistics
import sys

from common import base_parser, real_store, report
from runs import run_job

GRAPHS = ("cora", "citeseer", "amazon-photo")
MODELS = {
    "gcn decoupled": dict(model="gcn", arch="decoupled"),
    "gcn coupled": dict(model="gcn", arch="coupled"),
    "sage coupled": dict(model="sage", arch="coupled"),
}


def row(graph: str, model: str, precision: str, runs: list[dict]) -> dict:
    acc = [100 * r["test_metric"] for r in runs]
    return {
        "graph": graph,
        "model": model,
        "precision": precision,
        "test_acc_mean": statistics.mean(acc),
        "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        "seeds": len(acc),
        "epoch_ms": 1e3 * statistics.median(r["epoch_s"] for r in runs),
        "peak_MB": max(r["peak_mem_max"] for r in runs) / 1e6,
        "MB_sent_per_rank": statistics.median(r["MB_per_rank"] for r in runs),
    }


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=GRAPHS)
    p.add_argument("--models", nargs="+", default=["gcn decoupled", "gcn coupled"], choices=list(MODELS))
    p.add_argument("--seeds", type=int, default=5, help="seeds per (graph, model, precision)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--nproc", type=int, default=1, help="ranks (1: the single-process reference)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()
    if args.quick:
        args.graphs, args.models, args.seeds, args.epochs = ["cora"], ["gcn decoupled"], 2, 50
    rows = []
    for graph in args.graphs:
        store = real_store(graph)
        for model in args.models:
            pair = []
            for precision in ("fp32", "bf16"):
                runs = [
                    run_job(
                        store,
                        args.nproc,
                        args.epochs,
                        mode="tp",
                        device=args.device,
                        seed=seed,
                        precision=precision,
                        eval_every=1,
                        threads=args.threads or 0,
                        **MODELS[model],
                    )
                    for seed in range(args.seeds)
                ]
                pair.append(row(graph, model, precision, runs))
                print(
                    f"{graph} {model} {precision}: {pair[-1]['test_acc_mean']:.2f} +- {pair[-1]['test_acc_std']:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
            pair[1]["bf16_minus_fp32"] = pair[1]["test_acc_mean"] - pair[0]["test_acc_mean"]
            rows += pair
    report("precision", rows, vars(args))


if __name__ == "__main__":
    main()
