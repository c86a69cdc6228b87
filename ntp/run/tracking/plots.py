"""The figures logged with a training run: learning curves and per-worker time and traffic."""
from __future__ import annotations

from pathlib import Path

from ntp.records import Results
from ntp.run.tracking.tables import summarize, timing_table


def plot_curves(results: Results, path: str | Path) -> Path:
    """Loss curve and train/valid/test metric curves, one PNG."""
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
    fig.savefig(path)
    return Path(path)


def plot_workers(results: Results, path: str | Path) -> Path:
    """Per-worker compute and communication (stacked by kind) and bytes sent, mean per epoch (cf. Table 2)."""
    from matplotlib.figure import Figure

    table = timing_table(results)
    fig = Figure(figsize=(10, 4), dpi=100)
    ax_time, ax_bytes = fig.subplots(1, 2)
    if len(table):
        per_rank = table.groupby("rank").mean(numeric_only=True)
        ranks = [str(r) for r in per_rank.index]
        width = 0.4
        x = range(len(ranks))
        ax_time.bar([i - width / 2 for i in x], per_rank["compute_s"], width, label="compute")
        bottom = [0.0] * len(ranks)
        for col in [c for c in per_rank.columns if c.startswith("comm_s_") and c != "comm_s_total"]:
            vals = list(per_rank[col])
            ax_time.bar([i + width / 2 for i in x], vals, width, bottom=bottom, label=f"comm: {col[len('comm_s_'):]}")
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax_time.set_xticks(list(x), ranks)
        s = summarize(results)
        ax_time.set(xlabel="rank", ylabel="seconds per epoch",
                    title=f"compute max/min {s['compute_s_max']:.3g}/{s['compute_s_min']:.3g} s, "
                          f"comm {s['comm_s_max']:.3g}/{s['comm_s_min']:.3g} s")
        ax_time.legend(fontsize="small")
        bottom = [0.0] * len(ranks)
        for col in [c for c in per_rank.columns if c.startswith("bytes_sent_") and c != "bytes_sent_total"]:
            vals = [v / 2**20 for v in per_rank[col]]
            ax_bytes.bar(list(x), vals, 0.6, bottom=bottom, label=col[len("bytes_sent_"):])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax_bytes.set_xticks(list(x), ranks)
        ax_bytes.set(xlabel="rank", ylabel="MiB sent per epoch", title=f"bytes balance {s['bytes_balance']:.2f}")
        if bottom and any(bottom):
            ax_bytes.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)
