"""Benchmark: streaming store build of synthetic graphs (edges/s and peak RSS vs the memory bound).

    python bench/store_build.py                      # 5M nodes x degree 10 = 50M edges
    python bench/store_build.py --nodes 100000 1000000 --avg-degree 10

Each build runs in a fresh child process; its peak RSS (ru_maxrss) is compared with
2 x (final CSR bytes: indptr + indices) + 512 MiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from storage import open_store, prepare

    start = time.perf_counter()
    path = prepare(
        "synthetic",
        nodes=args.nodes[0],
        avg_degree=args.avg_degree,
        features=args.features,
        classes=args.classes,
        out=args.out,
        force=True,
        progress=lambda line: None,
    )
    seconds = time.perf_counter() - start
    m = open_store(path).meta
    csr_bytes = 8 * (m.num_nodes + 1) + (4 if m.index_dtype == "int32" else 8) * m.num_edges
    print(json.dumps({"nodes": m.num_nodes, "edges": m.num_edges, "seconds": seconds, "csr_bytes": csr_bytes}))


def run_one(nodes: int, args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / f"synthetic-{nodes}"
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--nodes",
        str(nodes),
        "--avg-degree",
        str(args.avg_degree),
        "--features",
        str(args.features),
        "--classes",
        str(args.classes),
        "--out",
        str(out),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"build of {nodes} nodes failed:\n{res.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    if peak < before * 1024:
        print("warning: peak RSS of an earlier, larger child may mask this one", file=sys.stderr)
    row = json.loads(res.stdout.strip().splitlines()[-1])
    row["peak_rss"] = peak
    row["bound"] = 2 * row["csr_bytes"] + 512 * MIB
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[5_000_000], help="vertex counts (one build each)")
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workdir", type=Path, help="where stores are built (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the built stores")
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="store-build-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"{'nodes':>12} {'edges':>13} {'seconds':>8} {'edges/s':>12} {'peak RSS MiB':>13} "
        f"{'CSR MiB':>8} {'bound MiB':>10}  ok"
    )
    ok = True
    # Ascending sizes so that ru_maxrss (a max over all children) reflects the current build.
    for nodes in sorted(args.nodes):
        r = run_one(nodes, args, workdir)
        good = r["peak_rss"] < r["bound"]
        ok &= good
        print(
            f"{r['nodes']:>12,} {r['edges']:>13,} {r['seconds']:>8.1f} {r['edges'] / r['seconds']:>12,.0f} "
            f"{r['peak_rss'] / MIB:>13,.0f} {r['csr_bytes'] / MIB:>8,.0f} {r['bound'] / MIB:>10,.0f}  "
            f"{'yes' if good else 'NO'}",
            flush=True,
        )
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
