"""Plots for docs/benchmarks.md from the JSON tables under bench/out/ (run after the benchmarks)."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import OUT, REPO  # noqa: E402

DOCS = REPO / "docs"


def _rows(name: str) -> list[dict]:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def kernel() -> None:
    rows = _rows("kernel")
    if not rows:
        return
    systems = [k for k in ("ntp_s", "dgl_s", "pyg_spmm_s", "pyg_mp_s") if any(r.get(k) for r in rows)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(systems)
    for i, s in enumerate(systems):
        ax.bar([j + i * width for j in range(len(rows))], [r.get(s) or 0 for r in rows], width, label=s[:-2])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["graph"] for r in rows])
    ax.set_ylabel("seconds (median), fwd + bwd")
    ax.set_title("Aggregation A @ H forward + backward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "bench_kernel.png", dpi=110)


def modes() -> None:
    rows = [r for r in _rows("modes") if r["ranks"] > 1]
    if not rows:
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for mode in sorted({r["mode"] for r in rows}):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["ranks"])
        for ax, key in zip(axes, ("graph_MB_per_rank", "compute_max/min", "epoch_s")):
            ax.plot([r["ranks"] for r in rs], [r[key] for r in rs], marker="o", label=mode)
            ax.set_title(key)
            ax.set_xlabel("ranks")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(DOCS / "bench_modes.png", dpi=110)


def depth_width() -> None:
    rows = _rows("depth_width")
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode in sorted({r["mode"] for r in rows}):
        for L in sorted({r["layers"] for r in rows}):
            rs = sorted((r for r in rows if r["mode"] == mode and r["layers"] == L), key=lambda r: r["width"])
            ax.plot([r["width"] for r in rs], [r["graph_MB"] for r in rs], marker="o", label=f"{mode} L={L}")
    ax.set_xlabel("hidden width")
    ax.set_ylabel("graph MB sent per rank per epoch")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_depth_width.png", dpi=110)


if __name__ == "__main__":
    kernel()
    modes()
    depth_width()
