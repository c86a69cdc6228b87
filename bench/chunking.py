"""Benchmark: memory-bounded chunked aggregation and inter-chunk pipelining (issue 4).

    python bench/chunking.py --quick
    python bench/chunking.py --nodes 400000 --avg-degree 40 --epochs 5

(a) Memory: a decoupled GCN on one process, unchunked, then chunked under a process RSS budget. The budget defaults
    to the midpoint between the unchunked run's non-aggregation peak (its "nn" phase) and its epoch peak, so the
    unchunked run exceeds it; the chunked run gets ``--memory-budget = budget - nn peak`` (the chunk working set may
    use what the rest of the epoch leaves). Reported: epoch peak RSS, peak per phase, chunks, epoch time and its
    ratio to unchunked (target <= 1.3x; peak <= budget).
    With ``--chunk-rows``, also fixed chunks with the topology and embeddings in host memory (``--offload all``).
(b) Pipelining: tensor-parallel decoupled GCN at 2 and 4 ranks (real torchrun jobs, gloo), chunked, pipelining
    off vs on, ``--repeats`` interleaved jobs each (median): epoch time, overlap_s, split+gather bytes per rank.
    Bytes without deduplication are computed from the chunk schedule (the same computation reproduces the measured
    bytes with deduplication, checked and printed).

Figures are medians over epochs after the first. The machine may be shared: compare ratios, not absolute times.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from common import base_parser, report, synthetic_store


def run(store: Path, nproc: int, epochs: int, **fields) -> dict:
    from ntp.config import TrainConfig
    from ntp.run.launch import launch_training
    from ntp.spec import resolve

    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        cfg = TrainConfig(
            store=str(store),
            epochs=epochs,
            results=str(results),
            eval_every=10**6,
            mode="tp" if nproc > 1 or fields.get("overlap") else "single",
            **fields,
        )
        launch_training(resolve(cfg, nproc=nproc, job_timeout_s=1800), on_line=lambda line: None)
        recs = [json.loads(line) for line in results.read_text().splitlines()]
    epochs_recs = [r for r in recs if "epoch" in r]
    timed = epochs_recs[1:] or epochs_recs
    workers = [w for e in timed for w in e["workers"]]  # the first epoch also builds the operators ("setup")
    phases: dict[str, int] = {}
    for w in workers:
        for k, v in w.get("peak_mem_by_phase", {}).items():
            phases[k] = max(phases.get(k, 0), v)
    med = lambda f: statistics.median(f(w) for e in timed for w in e["workers"])  # noqa: E731
    return {
        "epoch_s": statistics.median(e["epoch_s"] for e in timed),
        "peak_MB": max(w["peak_mem_bytes"] for w in workers) / 2**20,
        "nn_peak_MB": phases.get("nn", 0) / 2**20,
        "propagate_peak_MB": phases.get("propagate", 0) / 2**20,
        "chunks": timed[0]["workers"][0].get("chunks"),
        "overlap_s": med(lambda w: w.get("overlap_s", 0.0)),
        "comm_s": med(lambda w: sum(w["comm_s"].values())),
        "cpu_s": med(lambda w: w.get("cpu_s", 0.0)),
        "graph_MB_per_rank": med(lambda w: w["bytes_sent"].get("split", 0) + w["bytes_sent"].get("gather", 0)) / 1e6,
    }


def memory_part(store: Path, args) -> list[dict]:
    common = dict(model="gcn", hidden=args.hidden, nn_layers=2, prop_steps=args.prop_steps, dropout=0.0)
    first = run(store, 1, args.epochs, **common)
    budget_mb = args.rss_budget_mb or (first["nn_peak_MB"] + first["peak_MB"]) / 2
    chunk_mb = budget_mb - first["nn_peak_MB"]
    print(f"unchunked: {first}; RSS budget {budget_mb:.0f}MB, chunk working set {chunk_mb:.1f}MB", flush=True)
    variants = {"unchunked": {}}
    if chunk_mb > 0:
        variants[f"budget {chunk_mb:.1f}MiB"] = dict(memory_budget=f"{chunk_mb:.2f}MiB")
    else:
        print(f"budget {budget_mb:.0f}MB is below the non-aggregation peak {first['nn_peak_MB']:.0f}MB: cannot chunk")
    if args.chunk_rows:
        variants[f"chunk_rows {args.chunk_rows}"] = dict(chunk_rows=args.chunk_rows)
        variants[f"chunk_rows {args.chunk_rows} offload all"] = dict(chunk_rows=args.chunk_rows, offload="all")
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    runs["unchunked"].append(first)
    for repeat in range(args.repeats):  # interleaved, so a busy moment of the machine hits every variant alike
        for name, fields in variants.items():
            if not (repeat == 0 and name == "unchunked"):
                runs[name].append(run(store, 1, args.epochs, **fields, **common))
    whole = _median_run(runs["unchunked"])
    rows = []
    for name, fields in variants.items():
        r = _median_run(runs[name])
        extra = {} if name == "unchunked" else dict(time_vs_unchunked=r["epoch_s"] / whole["epoch_s"])
        if "memory_budget" in fields:
            extra["within_budget"] = str(r["peak_MB"] <= budget_mb)
        rows.append(dict(part="a-memory", run=name, budget_MB=budget_mb, **r, **extra))
    return rows


def schedule_bytes(store: Path, world: int, chunk_rows: int, classes: int, send_once: bool) -> int:
    """Max over ranks of the split+gather bytes of one pipelined epoch (GCN operator, prop_steps >= 2)."""
    from ntp.engine.distributed.partition import Partition
    from ntp.engine.graph.operators import CSR, transpose, with_self_loops
    from ntp.engine.memory.chunks import source_schedule, uniform_plan
    from storage import open_store

    s = open_store(str(store))
    pattern = with_self_loops(CSR.from_numpy(s.indptr(), s.indices()))
    t, _ = transpose(pattern)
    plan = uniform_plan(pattern.num_nodes, chunk_rows)
    scheds = [source_schedule(p.indptr, p.indices, plan, send_once) for p in (pattern, t)]
    per_rank = []
    for r in range(world):
        lay = Partition(pattern.num_nodes, world, r)
        r0, r1 = lay.rows()
        w_r = lay.cols(classes)[1] - lay.cols(classes)[0]
        split_rows = sum(int(((src >= r0) & (src < r1)).sum()) for sch in scheds for src in sch.new_sources)
        gather_rows = 2 * (pattern.num_nodes - lay.num_rows())  # forward gather and the backward's gather
        per_rank.append(4 * (split_rows * (classes - w_r) + gather_rows * w_r))
    return max(per_rank)


def pipeline_part(store: Path, args, classes: int) -> list[dict]:
    rows = []
    for world in args.ranks:
        common = dict(
            model="gcn",
            hidden=args.hidden,
            nn_layers=2,
            prop_steps=args.prop_steps,
            dropout=0.0,
            chunk_rows=args.pipe_chunk_rows,
        )
        offs, ons = [], []
        for _ in range(args.repeats):  # interleaved, so a busy moment of the machine hits both alike
            offs.append(run(store, world, args.epochs, **common))
            ons.append(run(store, world, args.epochs, overlap=True, **common))
        off, on = _median_run(offs), _median_run(ons)
        send_once = schedule_bytes(store, world, args.pipe_chunk_rows, classes, True) / 1e6
        no_dedup = schedule_bytes(store, world, args.pipe_chunk_rows, classes, False) / 1e6
        rows.append(dict(part="b-pipeline", run=f"{world} ranks off", **off))
        rows.append(
            dict(
                part="b-pipeline",
                run=f"{world} ranks on",
                **on,
                time_vs_off=on["epoch_s"] / off["epoch_s"],
                schedule_MB_dedup=send_once,
                schedule_MB_no_dedup=no_dedup,
            )
        )
    return rows


def _median_run(runs: list[dict]) -> dict:
    """The run with the median epoch time (its other figures come with it), plus every repeat's epoch time."""
    ordered = sorted(runs, key=lambda r: r["epoch_s"])
    return dict(ordered[(len(ordered) - 1) // 2], repeats_s=" ".join(f"{r['epoch_s']:.3f}" for r in runs))


def main() -> None:
    p = base_parser(__doc__, repeats=True, threads=False)
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--avg-degree", type=float, default=None)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--prop-steps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--rss-budget-mb", type=float, default=None, help="process RSS budget of part (a)")
    p.add_argument("--chunk-rows", type=int, default=None, help="part (a): also run with this explicit chunk size")
    p.add_argument("--pipe-chunk-rows", type=int, default=None, help="part (b) chunk size (default: nodes / 8)")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--parts", nargs="+", default=["a", "b"], choices=["a", "b"])
    args = p.parse_args()
    args.nodes = args.nodes or (60_000 if args.quick else 300_000)
    args.avg_degree = args.avg_degree or (20 if args.quick else 40)
    args.epochs = args.epochs or (3 if args.quick else 5)
    args.repeats = args.repeats or (1 if args.quick else 3)  # part (b): interleaved off/on jobs per rank count
    args.pipe_chunk_rows = args.pipe_chunk_rows or -(-args.nodes // 8)
    store = synthetic_store(args.nodes, args.avg_degree, features=args.features, classes=args.classes)
    rows = (memory_part(store, args) if "a" in args.parts else []) + (
        pipeline_part(store, args, args.classes) if "b" in args.parts else []
    )
    columns = [
        "part",
        "run",
        "epoch_s",
        "time_vs_unchunked",
        "time_vs_off",
        "chunks",
        "peak_MB",
        "budget_MB",
        "within_budget",
        "nn_peak_MB",
        "propagate_peak_MB",
        "overlap_s",
        "comm_s",
        "cpu_s",
        "graph_MB_per_rank",
        "schedule_MB_dedup",
        "schedule_MB_no_dedup",
        "repeats_s",
    ]
    report("chunking", rows, {k: v for k, v in vars(args).items()}, columns)


if __name__ == "__main__":
    main()
