"""The figures logged with a training run: learning curves, per-worker time and traffic, peak memory by phase.

Each ``*_figure`` returns a matplotlib ``Figure`` (no pyplot: no global state, no display needed) that the run logs
with ``MlflowClient.log_figure``; ``plot_*`` save the same figure to a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ntp.records import Results
from ntp.run.tracking.tables import summarize, timing_table

MIB = 2**20


def curves_figure(results: Results) -> Any:
    """Loss curve and train/valid/test metric curves."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    ax_loss, ax_metric = fig.subplots(1, 2)
    epochs = [e.epoch for e in results.epochs]
    ax_loss.plot(epochs, [e.loss for e in results.epochs], color="tab:red")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="Training loss")
    plotted = False
    for key, label in [("train_metric", "train"), ("valid_metric", "valid"), ("test_metric", "test")]:
        pts = [(e.epoch, getattr(e, key)) for e in results.epochs if getattr(e, key) is not None]
        if pts:
            ax_metric.plot(*zip(*pts), marker=".", label=label)
            plotted = True
    metric = results.final.metric if results.final else "metric"
    ax_metric.set(xlabel="epoch", ylabel=metric, title="Train / valid / test")
    if plotted:
        ax_metric.legend(loc="lower right")
    fig.tight_layout()
    return fig


def workers_figure(results: Results) -> Any:
    """Per-worker compute and communication (stacked by kind) and bytes sent, mean per epoch (cf. Table 2)."""
    from matplotlib.figure import Figure

    table = timing_table(results)
    fig = Figure(figsize=(10, 4), dpi=100)
    ax_time, ax_bytes = fig.subplots(1, 2)
    if len(table):
        per_rank = table.groupby("rank").mean(numeric_only=True)
        s = summarize(results)
        _time_bars(ax_time, per_rank, s)
        _byte_bars(ax_bytes, per_rank, s)
    fig.tight_layout()
    return fig


def _time_bars(ax: Any, per_rank: Any, s: dict[str, float]) -> None:
    ranks = [str(r) for r in per_rank.index]
    width, x = 0.4, range(len(ranks))
    ax.bar([i - width / 2 for i in x], per_rank["compute_s"], width, label="compute")
    bottom = [0.0] * len(ranks)
    for col in [c for c in per_rank.columns if c.startswith("comm_s_") and c != "comm_s_total"]:
        vals = list(per_rank[col])
        ax.bar([i + width / 2 for i in x], vals, width, bottom=bottom, label=f"comm: {col[len('comm_s_') :]}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(list(x), ranks)
    ax.set(
        xlabel="rank",
        ylabel="seconds per epoch",
        title=f"compute max/min {s['compute_s_max']:.3g}/{s['compute_s_min']:.3g} s, "
        f"comm {s['comm_s_max']:.3g}/{s['comm_s_min']:.3g} s",
    )
    ax.legend(fontsize="small")


def _byte_bars(ax: Any, per_rank: Any, s: dict[str, float]) -> None:
    x = range(len(per_rank))
    bottom = [0.0] * len(per_rank)
    for col in [c for c in per_rank.columns if c.startswith("bytes_sent_") and c != "bytes_sent_total"]:
        vals = [v / MIB for v in per_rank[col]]
        ax.bar(list(x), vals, 0.6, bottom=bottom, label=col[len("bytes_sent_") :])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(list(x), [str(r) for r in per_rank.index])
    ax.set(xlabel="rank", ylabel="MiB sent per epoch", title=f"bytes balance {s['bytes_balance']:.2f}")
    if any(bottom):
        ax.legend(fontsize="small")


def memory_peaks(results: Results) -> dict[int, dict[str, int]]:
    """Peak memory per rank and phase, max over epochs; a rank that measured no phases has one, "epoch"."""
    peaks: dict[int, dict[str, int]] = {}
    for e in results.epochs:
        for w in e.workers:
            phases = w.peak_mem_by_phase or {"epoch": w.peak_mem_bytes}
            mine = peaks.setdefault(w.rank, {})
            for phase, value in phases.items():
                mine[phase] = max(mine.get(phase, 0), int(value))
    return dict(sorted(peaks.items()))


def memory_figure(results: Results) -> Any:
    """Peak memory per phase (grouped bars) per rank: which phase sets each rank's peak."""
    from matplotlib.figure import Figure

    peaks = memory_peaks(results)
    phases = sorted({p for by_phase in peaks.values() for p in by_phase})
    fig = Figure(figsize=(6 + 0.5 * len(peaks), 4), dpi=100)
    ax = fig.subplots()
    width = 0.8 / max(len(phases), 1)
    for j, phase in enumerate(phases):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(peaks))]
        ax.bar(xs, [by_phase.get(phase, 0) / MIB for by_phase in peaks.values()], width, label=phase)
    ax.set_xticks(list(range(len(peaks))), [str(r) for r in peaks])
    ax.set(xlabel="rank", ylabel="peak MiB (max over epochs)", title="Peak memory by phase")
    if phases:
        ax.legend(title="phase", fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the bars
    fig.tight_layout()
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    fig.savefig(path)
    return Path(path)


def plot_curves(results: Results, path: str | Path) -> Path:
    """:func:`curves_figure` as a PNG file."""
    return _save(curves_figure(results), path)


def plot_workers(results: Results, path: str | Path) -> Path:
    """:func:`workers_figure` as a PNG file."""
    return _save(workers_figure(results), path)


def plot_memory(results: Results, path: str | Path) -> Path:
    """:func:`memory_figure` as a PNG file."""
    return _save(memory_figure(results), path)
