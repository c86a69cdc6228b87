"""Hand-written results files for the parsing, plotting and MLflow-logging tests (no training)."""

from __future__ import annotations

import json
from pathlib import Path


def epoch_record(epoch: int, ranks: int = 2, evaluated: bool = True) -> dict:
    workers = [
        {
            "rank": r,
            "compute_s": 0.10 + 0.01 * r,
            "comm_s": {"split": 0.02, "gather": 0.03, "allreduce": 0.001},
            "bytes_sent": {"split": 1000 * (r + 1), "gather": 2000, "allreduce": 64},
            "bytes_recv": {"split": 1000, "gather": 2000 * (r + 1), "allreduce": 64},
            "peak_mem_bytes": 100_000_000 + r,
            "chunks": 4,
            "overlap_s": 0.01 * r,
            "cpu_s": 0.2,
            "nn_device": "cpu",
            "offload": "none",
            "overlapped": r == 1,
            "peak_mem_by_phase": {"nn": 90_000_000, "propagate": 100_000_000 + r},
            "host_pss_bytes": 300_000 + r,
            "topology_bytes": 8_000,
            "device_topology_bytes": 0,
            "host": f"node-{r // 2}",  # two ranks per machine
        }
        for r in range(ranks)
    ]
    return {
        "epoch": epoch,
        "loss": 2.0 / (epoch + 1),
        "train_metric": 0.5 + 0.1 * epoch if evaluated else None,
        "valid_metric": 0.4 + 0.1 * epoch if evaluated else None,
        "test_metric": 0.35 + 0.1 * epoch if evaluated else None,
        "epoch_s": 0.2 + 0.01 * epoch,
        "workers": workers,
    }


def write_results(path: Path, epochs: int = 3, ranks: int = 2, final: bool = True, truncated: bool = False) -> Path:
    lines = [json.dumps(epoch_record(e, ranks, evaluated=(e % 2 == 0 or e == epochs - 1))) for e in range(epochs)]
    if final:
        lines.append(
            json.dumps(
                {
                    "final": True,
                    "best_epoch": epochs - 1,
                    "best_valid_metric": 0.6,
                    "test_metric": 0.55,
                    "metric": "acc",
                    "world_size": ranks,
                    "epochs_run": epochs,
                    "config": {"model": "gcn", "epochs": epochs},
                }
            )
        )
    text = "\n".join(lines) + "\n"
    if truncated:
        text += '{"epoch": 99, "loss": 1.'
    path.write_text(text)
    return path
