"""Dropout alone: one layer's dropout and product, forward and backward, in each way ntp can run them.

    python bench/dropout.py --threads 1
    python bench/dropout.py --threads 2 --layers input:128:64 hidden:64:16 hidden:64:64 --rate 0.5 0.3
    python bench/dropout.py --device cuda --rows 2400000 --layers input:100:64 hidden:64:47 --rate 0.5 0.3

A layer is ``kind:in:out`` on ``--rows`` rows: ``input`` drops features (no gradient), ``hidden`` drops ReLU's
output and sends the gradient back to its input. Each way takes turns with the others (a shared box drifts between
runs by more than dropout costs) and reports its median time and the bytes autograd keeps for the backward:

- ``none``: the product alone (``hidden``: after torch's ReLU): what ``--dropout 0`` runs;
- ``ntp``: what ``RowDropout.linear`` runs: the dropout inside the product, block by block, from 8 MB of input
  (``dropout._FUSED_LEAST_BYTES``), below it ``copy``;
- ``copy``: the C kernel's dropped copy, then the product (SAGE, and layers that propagate first);
- ``torch_ops``: the mask drawn, then applied by torch's ops (``NTP_NATIVE=0``, or no C compiler at install; on
  CUDA, no Triton);
- ``torch``: torch's own dropout (``F.dropout``; its masks depend on the world size: what ntp's replace).

On CUDA ``ntp`` and ``copy`` are the same: the Triton kernel's dropped copy, then the product.
``cost`` is ``ntp`` over ``none``, less one: what dropout adds to the layer. ``kernel_ns``: the kernel alone, ns an
element: on a CPU the C kernel dropping one of the blocks ``ntp`` drops at a time (in cache) over and over, on CUDA
the Triton kernel dropping the whole input (``kernel_GBps``: the bytes it reads and writes a second).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from common import ALLOCATORS, base_parser, report, same_allocator, torch_ops_dropout


def layer_runs(kind: str, rows: int, width_in: int, width_out: int, rate: float, device: torch.device) -> dict:
    """The ways to run one layer: each a call that runs it forward and backward, and returns the saved bytes."""
    from ntp.engine.kernels.dropout import RowDropout
    from ntp.engine.kernels.linear import Linear

    hidden = kind == "hidden"
    x = torch.randn(rows, width_in, device=device)
    grad = torch.randn(rows, width_out, device=device)
    lin = Linear(width_in, width_out).to(device)
    ctx = SimpleNamespace(seed=0, step=0, row_offset=0)
    step = iter(range(10**9))

    def run(forward) -> int:
        ctx.step, lin.weight.grad, lin.bias.grad = next(step), None, None
        leaf = x.detach().requires_grad_(hidden)
        saved: dict[int, int] = {}  # storage -> bytes: a tensor saved twice is kept once
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.update({_storage(t): _nbytes(t)}) or t, lambda t: t
        ):
            y = forward(leaf)
        y.backward(grad)
        return sum(n for at, n in saved.items() if at not in (_storage(x), _storage(lin.weight)))

    none, drop = RowDropout(0.0, 0), RowDropout(rate, 0)
    ways = {
        "none": lambda leaf: lin(none(leaf, ctx, hidden)),
        "ntp": lambda leaf: drop.linear(leaf, ctx, lin.weight, lin.bias, relu=hidden),
        "copy": lambda leaf: lin(drop(leaf, ctx, hidden)),
        "torch": lambda leaf: lin(F.dropout(F.relu(leaf) if hidden else leaf, rate)),
    }
    ways["torch_ops"] = ways["ntp"]  # run inside torch_ops_dropout()
    return {name: (lambda f=f: run(f)) for name, f in ways.items()}


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def measure(
    kind: str, rows: int, width_in: int, width_out: int, rate: float, repeats: int, device: torch.device
) -> dict:
    runs = layer_runs(kind, rows, width_in, width_out, rate, device)
    times: dict[str, list[float]] = {name: [] for name in runs}
    saved = {}
    for turn in range(repeats + 1):  # the first turn warms up
        for name, fn in runs.items():
            with torch_ops_dropout() if name == "torch_ops" else contextlib.nullcontext():
                _sync(device)
                start = time.perf_counter()
                saved[name] = fn()
                _sync(device)
                elapsed = time.perf_counter() - start
            if turn:
                times[name].append(elapsed)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    row = {
        "layer": f"{kind} {width_in}->{width_out}",
        "rows": rows,
        "p": rate,
        "device": device.type,
        "threads": torch.get_num_threads(),
    }
    row.update({f"{name}_ms": v for name, v in ms.items()})
    row["cost"] = ms["ntp"] / ms["none"] - 1
    row.update({f"{name}_saved_MB": saved[name] / 2**20 for name in ("none", "ntp", "copy")})
    return row


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_ns(rows: int, width: int, rate: float, relu: bool, device: torch.device, calls: int = 200) -> float | None:
    """The kernel's time an element (None where it is not built): on a CPU on one block of ``RowDropout.linear``'s
    rows, on CUDA on all ``rows`` (with the backward's mask where ``relu``, as a hidden layer writes it)."""
    from ntp.engine.kernels import cuda_dropout, dropout

    x = torch.randn(dropout._block_rows(width, 4) if device.type == "cpu" else rows, width, device=device)
    if not dropout.one_pass(x):
        return None
    y = torch.empty_like(x)
    mask = torch.empty(x.shape, dtype=torch.bool, device=device) if relu and device.type == "cuda" else None
    times = []
    for call in range(calls + 1):
        _sync(device)
        start = time.perf_counter()
        if device.type == "cpu":
            dropout._drop_rows(x, y, None, rate, 7, call * x.numel(), width, relu)
        else:
            cuda_dropout.drop_into(x, y, mask, rate, 7, call * x.numel(), width, relu)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 1e9 * statistics.median(times[1:]) / x.numel()


def main() -> None:
    p = base_parser(__doc__, repeats=True)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument(
        "--layers",
        nargs="+",
        default=["input:128:64", "hidden:64:16", "hidden:64:64"],
        help="kind:in:out, kind input (features, no gradient) or hidden (after ReLU)",
    )
    p.add_argument(
        "--rate",
        type=float,
        nargs="+",
        default=[0.5],
        help="dropout rates (0.5, the default, draws 1 random bit an element; 8 or 16 bits for others)",
    )
    p.add_argument(
        "--allocator",
        choices=list(ALLOCATORS),
        default="hugepages",
        help="large blocks in transparent huge pages, as ntp's ranks get them (default)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: the Triton kernel and torch's dropout")
    args = p.parse_args()
    device = torch.device(args.device)
    same_allocator(args.allocator)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (7 if args.quick else 21)
    rows = []
    for spec in args.layers:
        kind, width_in, width_out = spec.split(":")
        if kind not in ("input", "hidden"):
            raise SystemExit(f"--layers {spec}: the kind is input or hidden")
        for rate in args.rate:
            rows.append(measure(kind, args.rows, int(width_in), int(width_out), rate, repeats, device))
            ns = kernel_ns(args.rows, int(width_in), rate, kind == "hidden", device)
            rows[-1]["kernel_ns"] = ns
            if ns is not None and device.type == "cuda":  # 4 bytes read and written an element, and the mask's
                rows[-1]["kernel_GBps"] = (8 + (kind == "hidden")) / ns
            print(rows[-1], flush=True)
    report(
        "dropout",
        rows,
        {
            "rows": args.rows,
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "allocator": args.allocator,
            "rates": args.rate,
            "device": device.type,
        },
    )


if __name__ == "__main__":
    main()
