"""Benchmark 5: store build throughput / peak RSS and read throughput, by running bench/store_build.py and
bench/store_read.py (unchanged) and collecting their tables into one report logged to MLflow.

    python bench/store.py --quick       # 200k-vertex build, 100k-vertex reads
    python bench/store.py               # 5M vertices x degree 10 (50M edges) build, 500k-vertex reads
"""

from __future__ import annotations

import subprocess
import sys

from common import REPO, base_parser, report


def run(script: str, argv: list[str]) -> str:
    res = subprocess.run([sys.executable, str(REPO / "bench" / script), *argv], capture_output=True, text=True)
    if res.returncode not in (0, 1):
        sys.exit(f"{script} failed:\n{res.stderr[-2000:]}")
    return res.stdout


def main() -> None:
    args = base_parser(__doc__, threads=False).parse_args()
    build = run("store_build.py", ["--nodes", "200000"] if args.quick else ["--nodes", "5000000"])
    read = run("store_read.py", ["--nodes", "100000"] if args.quick else ["--nodes", "500000"])
    rows = [{"benchmark": "build", "line": line} for line in build.strip().splitlines()]
    rows += [{"benchmark": "read", "line": line} for line in read.strip().splitlines()]
    print(build)
    print(read)
    report("store", rows, {"quick": args.quick})


if __name__ == "__main__":
    main()
