"""Plots for docs/benchmarks.md from the JSON tables under bench/out/ (run after the benchmarks), and for
docs/recipes.md from its own table."""

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


def chunking() -> None:
    rows = _rows("chunking")
    memory = [r for r in rows if r["part"] == "a-memory"]
    pipe = [r for r in rows if r["part"] == "b-pipeline"]
    if not memory and not pipe:
        return
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [r["run"].replace("chunk_rows", "rows").replace(" offload", "\noffload") for r in memory]
    ax_mem.bar(range(len(memory)), [r["peak_MB"] for r in memory], color="tab:blue")
    if memory:
        ax_mem.axhline(memory[0]["budget_MB"], color="tab:red", linestyle="--", label="RSS budget")
        low = min(r["peak_MB"] for r in memory)
        ax_mem.set_ylim(low * 0.9, max(r["peak_MB"] for r in memory) * 1.03)
    ax_mem.set_xticks(range(len(memory)), names, fontsize=7)
    ax_mem.set_ylabel("peak RSS, MB (one process)")
    ax_mem.set_title("(a) chunks keep the peak under the budget", fontsize=9)
    ax_mem.legend(fontsize=7)
    for i, r in enumerate(pipe):  # every repeat as a dot, the median as a bar
        runs = [float(t) for t in str(r.get("repeats_s", "")).split()]
        ax_time.bar(i, r["epoch_s"], color="tab:green" if r["run"].endswith(" on") else "tab:gray")
        ax_time.scatter([i] * len(runs), runs, color="black", s=10, zorder=3)
    ax_time.set_xticks(range(len(pipe)), [r["run"].replace(" ranks ", "r\npipeline ") for r in pipe], fontsize=7)
    ax_time.set_ylabel("epoch s (bar: median job; dots: each job)")
    ax_time.set_title("(b) pipelining off vs on (gloo, 2 cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_chunking.png", dpi=110)


def time_to_accuracy() -> None:
    """Validation accuracy against training seconds, one panel per graph, the 98 % target as a dashed line."""
    rows = _rows("time_to_accuracy")
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    if not graphs:
        return
    fig, axes = plt.subplots(1, len(graphs), figsize=(3.2 * len(graphs), 3), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        for r in (r for r in rows if r["graph"] == graph):
            ax.plot([t for t, _ in r["curve"]], [a for _, a in r["curve"]], label=r["system"])
            ax.axhline(r["target_valid"], color="gray", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(graph, fontsize=9)
        ax.set_xlabel("training seconds (log)")
    axes[0][0].set_ylabel("validation accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_time_to_accuracy.png", dpi=110)


def _recipe_rows() -> list[dict]:
    """The table of docs/recipes.md (its rows come from several sittings, each named in its note): recipe, target,
    ours, std, met."""
    import re

    section = (DOCS / "recipes.md").read_text().split("## Where ours stands", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] == "recipe":
            continue
        target = re.search(r"\d+\.\d+", cells[2])
        ours = re.match(r"([\d.]+) \+- ([\d.]+)", cells[3])
        if target and ours and not cells[2].startswith("open"):
            rows.append(
                {
                    "recipe": cells[0],
                    "target": float(target.group()),
                    "ours": float(ours.group(1)),
                    "std": float(ours.group(2)),
                    "runs": cells[4],
                    "met": cells[5],
                }
            )
    return rows


def recipes() -> None:
    """Each recipe's mean minus its published figure, in points, with the runs' standard deviation as a bar."""
    rows = _recipe_rows()
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for y, r in enumerate(reversed(rows)):
        judged = r["met"] in ("yes", "no")
        color = {"yes": "tab:green", "no": "tab:red"}.get(r["met"], "tab:gray")
        ax.errorbar(
            r["ours"] - r["target"], y, xerr=r["std"], fmt="o", color=color, mfc=color if judged else "white", capsize=3
        )
        note = "" if judged else f" ({r['runs']}, not judged yet)"
        ax.annotate(
            f"{r['ours']:.2f} +- {r['std']:.2f} vs {r['target']:.2f}{note}",
            (1, y),
            xycoords=("axes fraction", "data"),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.axvline(0, color="gray", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r["recipe"] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel("ours minus the published figure (points); bar: +- the runs' standard deviation")
    ax.set_title("Recipes against the literature (docs/recipes.md)", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_recipes.png", dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    kernel()
    modes()
    depth_width()
    chunking()
    time_to_accuracy()
    recipes()
