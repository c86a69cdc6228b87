"""What tracking logs, computed from the typed records: the parent's per-epoch metrics (the key curves only),
per-worker metrics (child runs), the timing table, the per-worker summary and the job summary (max/min balance over
workers, bytes per edge)."""

from __future__ import annotations

import statistics
from typing import Any

from ntp.records import EpochRecord, Results, WorkerStats


def _kinds(results: Results, key: str) -> list[str]:
    kinds: set[str] = set()
    for e in results.epochs:
        for w in e.workers:
            kinds.update(getattr(w, key).keys())
    return sorted(kinds)


def timing_table(results: Results) -> Any:
    """One row per (epoch, rank): compute, communication per kind, bytes per kind, totals, peak memory."""
    import pandas as pd

    comm_kinds = _kinds(results, "comm_s")
    byte_kinds = sorted(set(_kinds(results, "bytes_sent")) | set(_kinds(results, "bytes_recv")))
    rows = []
    for e in results.epochs:
        for w in e.workers:
            row: dict[str, Any] = {"epoch": e.epoch, "rank": w.rank, "epoch_s": e.epoch_s, "compute_s": w.compute_s}
            row.update({f"comm_s_{k}": float(w.comm_s.get(k, 0.0)) for k in comm_kinds})
            row["comm_s_total"] = w.comm_total_s
            row.update({f"bytes_sent_{k}": int(w.bytes_sent.get(k, 0)) for k in byte_kinds})
            row.update({f"bytes_recv_{k}": int(w.bytes_recv.get(k, 0)) for k in byte_kinds})
            row["bytes_sent_total"] = w.sent_total
            row["bytes_recv_total"] = w.recv_total
            row["peak_mem_bytes"] = int(w.peak_mem_bytes)
            row.update(_chunking_fields(w))
            rows.append(row)
    columns = ["epoch", "rank", "epoch_s", "compute_s"]
    return pd.DataFrame(rows, columns=columns + [c for c in (rows[0] if rows else {}) if c not in columns])


def _ratio(hi: float, lo: float) -> float:
    return hi / lo if lo > 0 else (1.0 if hi == 0 else float("inf"))


def worker_summary(results: Results) -> Any:
    """One row per rank, means over epochs: compute and exposed communication seconds, bytes sent and received,
    peak memory (the per-worker table of the run)."""
    import pandas as pd

    table = timing_table(results)
    columns = {
        "compute_s": "compute_s",
        "comm_s_total": "comm_s",
        "bytes_sent_total": "bytes_sent",
        "bytes_recv_total": "bytes_recv",
        "peak_mem_bytes": "peak_mem_bytes",
    }
    if not len(table):
        return pd.DataFrame(columns=["rank", *columns.values()])
    per_rank = table.groupby("rank")[list(columns)].mean().rename(columns=columns)
    return per_rank.reset_index()


def summarize(results: Results, num_edges: int | None = None) -> dict[str, float]:
    """Job-level numbers: median epoch time, per-rank means over epochs, max/min balance, final metrics and, given
    the store's edge count, bytes per edge (``comm_bytes_per_edge``, ``peak_mem_bytes_per_edge``, the host memory of
    one machine ``host_bytes_per_edge`` (its ranks' PSS), ``topology_bytes_per_edge`` and its device share)."""
    out: dict[str, float] = {"epochs_run": float(len(results.epochs))}
    if results.epochs:
        out["epoch_s_median"] = float(statistics.median(e.epoch_s for e in results.epochs))
        per_rank = worker_summary(results)
        if len(per_rank):
            out.update(_balance(per_rank))
            if num_edges:
                out.update(_per_edge(results, out["bytes_per_rank_per_epoch"], num_edges))
    final = results.final
    if final is not None:
        for key, value in (
            ("best_epoch", final.best_epoch),
            ("best_valid_metric", final.best_valid_metric),
            ("final_test_metric", final.test_metric),
        ):
            if value is not None:
                out[key] = float(value)
    return out


def _balance(per_rank: Any) -> dict[str, float]:
    """Max and min over ranks of the per-rank means, and their ratios."""
    out: dict[str, float] = {}
    for col, name in [
        ("compute_s", "compute_s"),
        ("comm_s", "comm_s"),
        ("bytes_sent", "bytes_sent_per_epoch"),
        ("peak_mem_bytes", "peak_mem_bytes"),
    ]:
        out[f"{name}_max"] = float(per_rank[col].max())
        out[f"{name}_min"] = float(per_rank[col].min())
    out["bytes_per_rank_per_epoch"] = float(per_rank["bytes_sent"].mean())
    out["compute_balance"] = _ratio(out["compute_s_max"], out["compute_s_min"])
    out["bytes_balance"] = _ratio(out["bytes_sent_per_epoch_max"], out["bytes_sent_per_epoch_min"])
    return out


def _per_edge(results: Results, bytes_per_rank: float, num_edges: int) -> dict[str, float]:
    """Traffic and memory normalised by the graph's size, so runs on different graphs compare."""
    peak = max(w.peak_mem_bytes for e in results.epochs for w in e.workers)
    last = results.epochs[-1].workers
    hosts = {w.host for w in last}  # a machine's ranks share its topology: count it once per machine
    return {
        "comm_bytes_per_edge": bytes_per_rank / num_edges,
        "peak_mem_bytes_per_edge": float(peak) / num_edges,
        "host_bytes_per_edge": sum(w.host_pss_bytes for w in last) / len(hosts) / num_edges,
        "topology_bytes_per_edge": max(w.topology_bytes for w in last) / num_edges,
        "device_topology_bytes_per_edge": max(w.device_topology_bytes for w in last) / num_edges,
    }


def epoch_metrics(record: EpochRecord) -> dict[str, float]:
    """Parent-run metrics of one epoch: only the key curves (loss, split metrics, epoch and evaluation time), so the
    run's charts lead with them; per-worker series live in the child runs, their balance in the summary."""
    out = {"loss": float(record.loss)}
    out.update({f"{split}_metric": float(v) for split, v in record.metrics().items()})
    if record.valid_loss is not None:
        out["valid_loss"] = float(record.valid_loss)
    out["epoch_s"] = float(record.epoch_s)
    if record.eval_s is not None:
        out["eval_s"] = float(record.eval_s)
    if record.lr is not None:
        out["lr"] = float(record.lr)
    return out


def worker_metrics(worker: WorkerStats) -> dict[str, float]:
    """Child-run metrics of one worker in one epoch."""
    out = {
        "compute_s": float(worker.compute_s),
        "peak_mem_bytes": float(worker.peak_mem_bytes),
        "host_pss_bytes": float(worker.host_pss_bytes),
        "device_topology_bytes": float(worker.device_topology_bytes),
    }
    for key in ("comm_s", "bytes_sent", "bytes_recv"):
        parts = getattr(worker, key)
        out[f"{key}_total"] = float(sum(parts.values()))
        out.update({f"{key}/{kind}": float(v) for kind, v in parts.items()})
    out.update({k.replace("peak_mem_", "peak_mem/"): v for k, v in _chunking_fields(worker).items()})
    return out


def _chunking_fields(worker: WorkerStats) -> dict[str, float]:
    """Chunks, communication overlapped with compute, CPU seconds and peak memory per phase."""
    out = {"chunks": float(worker.chunks), "overlap_s": float(worker.overlap_s), "cpu_s": float(worker.cpu_s)}
    out.update({f"peak_mem_{phase}": float(v) for phase, v in worker.peak_mem_by_phase.items()})
    return out
