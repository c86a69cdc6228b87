"""Where one rank's epoch goes: torch.profiler's table of a few epochs of ntp's training step, in this process.

    python bench/profile_epoch.py --size products --options offload=all memory_budget=8GB
    python bench/profile_epoch.py --device cpu --size tiny --options dropout=0.3

``--options`` are TrainConfig fields (``name=value``; numbers and booleans as such). The epochs after the warm-up are
timed first without the profiler (their median, synchronised), then profiled; the table lists the operators by their
device time (CUDA) or CPU time (``--trace`` saves the profiled epochs' Chrome trace in bench/out). On CUDA a line
follows: the device's time an epoch in copies up, copies down and kernels, their sum, the time the device was busy
with any of them, and the difference: how much of them overlapped (``--offload``'s copies and products); and one
more: the bytes an epoch copied up and down, and the rate of each while copying (the trace's copies carry their
bytes), beside which a count of what the code moves can be read (docs/memory.md).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import OUT, base_parser, synthetic_store
from gpu import SIZES


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    p = base_parser(__doc__, quick=False, threads=False)
    p.add_argument("--size", default="products", choices=list(SIZES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--options", nargs="*", default=[], help="TrainConfig fields, name=value")
    p.add_argument("--epochs", type=int, default=3, help="epochs timed, then as many profiled (after one warm-up)")
    p.add_argument("--rows", type=int, default=30, help="operators listed")
    p.add_argument("--trace", action="store_true", help="also save the profiled epochs' Chrome trace in bench/out")
    args = p.parse_args()

    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import init_distributed
    from ntp.engine.train.loop import train_step
    from ntp.engine.train.setup import setup

    nodes, degree, features = SIZES[args.size]
    store = synthetic_store(nodes, degree, features)
    fields = dict(option.split("=", 1) for option in args.options)
    cfg = TrainConfig(
        store=str(store),
        model="gcn",
        arch="coupled",
        hidden=64,
        mode="single",
        **{k: _value(v) for k, v in fields.items()},
    )
    cuda = args.device == "cuda"
    job = setup(cfg, init_distributed(120, device=args.device))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    epoch = iter(range(10**6))
    train_step(job, next(epoch))  # warm-up
    times = []
    for _ in range(args.epochs):
        sync()
        start = time.perf_counter()
        train_step(job, next(epoch))
        sync()
        times.append(time.perf_counter() - start)
    print(
        f"epoch {statistics.median(times):.4f} s (median of {args.epochs}), {cfg.offload=}, {cfg.memory_budget=}",
        flush=True,
    )
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.epochs):
            train_step(job, next(epoch))
        sync()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows), flush=True)
    if cuda:
        print(device_overlap(prof.events(), args.epochs), flush=True)
    if args.trace or cuda:  # the trace, exported once: saved (--trace), read for its copies (CUDA)
        with tempfile.TemporaryDirectory() as scratch:
            trace = OUT / f"profile-{args.size}.json" if args.trace else Path(scratch) / "trace.json"
            trace.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))
            if cuda:
                print(copied(json.loads(trace.read_text()), args.epochs), flush=True)


def device_overlap(events, epochs: int) -> str:
    """One line: the device's milliseconds an epoch by kind of activity (copies up, copies down, kernels), their sum,
    the time any ran (the union of their intervals), and the overlap (the sum less the union)."""
    spans: dict[str, list[tuple[float, float]]] = {"up": [], "down": [], "kernels": []}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = "up" if "HtoD" in e.name else "down" if "DtoH" in e.name else "kernels"
        spans[kind].append((e.time_range.start, e.time_range.end))
    per = {kind: sum(b - a for a, b in s) / 1e3 / epochs for kind, s in spans.items()}
    busy = _union(sorted(x for s in spans.values() for x in s)) / 1e3 / epochs
    total = sum(per.values())
    return (
        f"device ms an epoch: up {per['up']:.1f}, down {per['down']:.1f}, kernels {per['kernels']:.1f}; "
        f"sum {total:.1f}, busy {busy:.1f}, overlapped {total - busy:.1f}"
    )


def copied(trace: dict, epochs: int) -> str:
    """One line: the GB an epoch a Chrome trace's copies moved up (host to device) and down, and each direction's
    GB/s while copying (its bytes over its copies' time; copies that overlap each other count their time twice)."""
    moved = {"HtoD": [0, 0.0], "DtoH": [0, 0.0]}
    for event in trace.get("traceEvents", []):
        name, args = event.get("name", ""), event.get("args", {})
        kind = next((k for k in moved if name.startswith(f"Memcpy {k}")), None)
        if kind and "bytes" in args:
            moved[kind][0] += args["bytes"]
            moved[kind][1] += event.get("dur", 0.0) / 1e6
    (up, up_s), (down, down_s) = moved["HtoD"], moved["DtoH"]
    rate = lambda b, s: f"{b / s / 1e9:.1f} GB/s" if s else "-"  # noqa: E731
    return (
        f"copied an epoch: up {up / 1e9 / epochs:.3f} GB ({rate(up, up_s)}), "
        f"down {down / 1e9 / epochs:.3f} GB ({rate(down, down_s)})"
    )


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals sorted by their start."""
    length, end = 0.0, float("-inf")
    for a, b in intervals:
        if b > end:
            length += b - max(a, end)
            end = b
    return length


if __name__ == "__main__":
    main()
