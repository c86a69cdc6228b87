"""One real torchrun training job (ntp.run.launch.launch_training) and the per-rank figures of its results file."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from common import REPO  # noqa: F401  (puts the repo on sys.path)

COMM_GRAPH = ("split", "gather", "halo")


def run_job(store: Path, nproc: int, epochs: int, **cfg_fields) -> dict:
    """Train ``epochs`` epochs on ``nproc`` ranks; medians over epochs after the first (warm-up)."""
    from ntp.config import TrainConfig
    from ntp.run.launch import launch_training
    from ntp.spec import resolve

    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        mode = cfg_fields.pop("mode")
        device = cfg_fields.pop("device", "auto")
        cfg_fields.setdefault("eval_every", 10**6)  # timings: evaluate once, at the end
        cfg = TrainConfig(
            store=str(store),
            epochs=epochs,
            results=str(results),
            mode=mode if nproc > 1 or mode == "data" else "single",
            **cfg_fields,
        )
        launch_training(resolve(cfg, nproc=nproc, device=device, job_timeout_s=1800), on_line=lambda line: None)
        recs = [json.loads(line) for line in results.read_text().splitlines()]
    epochs_recs = [r for r in recs if "epoch" in r][1:] or [r for r in recs if "epoch" in r]
    m = len(epochs_recs[0]["workers"])
    med = lambda f: [statistics.median(f(e["workers"][r]) for e in epochs_recs) for r in range(m)]  # noqa: E731
    sent = med(lambda w: sum(w["bytes_sent"].values()))
    graph_sent = med(lambda w: sum(v for k, v in w["bytes_sent"].items() if k in COMM_GRAPH))
    compute = med(lambda w: w["compute_s"])
    comm = med(lambda w: sum(w["comm_s"].values()))
    ratio = lambda v: max(v) / min(v) if min(v) > 0 else (1.0 if max(v) == 0 else float("inf"))  # noqa: E731
    return {
        "epoch_s": statistics.median(e["epoch_s"] for e in epochs_recs),
        "MB_per_rank": statistics.mean(sent) / 1e6,
        "graph_MB_per_rank": statistics.mean(graph_sent) / 1e6,
        "bytes_max/min": ratio(sent),
        "compute_max/min": ratio(compute),
        "comm_max/min": ratio(comm),
        "compute_max_s": max(compute),
        "comm_max_s": max(comm),
        "graph_bytes_per_rank": graph_sent,
        "test_metric": recs[-1].get("test_metric"),
        **_memory(epochs_recs, recs),
    }


def _memory(epoch_recs: list[dict], recs: list[dict]) -> dict:
    """Memory of the last epoch: peak per rank (max), and by phase ("nn", "propagate": where the peak is), the node's
    host PSS (sum over ranks: one node here), the topology's bytes (one copy per node) and what it keeps on a device
    (max over ranks), and the edge count."""
    from storage import open_store

    last = epoch_recs[-1]["workers"]
    final = recs[-1]
    return {
        "peak_mem_max": max(w.get("peak_mem_bytes", 0) for w in last),
        "peak_mem_by_phase": {
            phase: max(w.get("peak_mem_by_phase", {}).get(phase, 0) for w in last)
            for phase in sorted({p for w in last for p in w.get("peak_mem_by_phase", {})})
        },
        "host_pss_node": sum(w.get("host_pss_bytes", 0) for w in last),
        "topology_bytes": last[0].get("topology_bytes", 0),
        "device_topology_bytes": max(w.get("device_topology_bytes", 0) for w in last),
        "chunks": last[0].get("chunks"),
        "nn_device": last[0].get("nn_device"),
        "edges": open_store(final["config"]["store"]).meta.num_edges,
    }
