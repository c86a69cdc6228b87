"""Benchmark: inference on the training launcher (issue 17): `ntp predict` end to end.

    python bench/inference.py --quick                      # 100k vertices, average degree 10, 128 features
    python bench/inference.py --nodes 500000 --avg-degree 20

A decoupled GCN (hidden 64) is trained for one epoch in this process, then applied with `ntp predict` at 1, 2 and 3
ranks (torchrun, gloo), unchunked and chunked (--chunk-rows n/8): wall time of the whole command (launch, store
read, forward pass, Parquet writes, publish) and rank 0's phases (load: store and model; forward; write), nodes
per second, the export's size, and beside it the wall time of a
1-epoch training job on the same launcher (what launching, loading and one forward/backward pass cost). Every
export is compared with the 1-rank one (same classes; probabilities within 1e-5). The machine may be shared:
compare ratios.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import base_parser, report, synthetic_store


def train_model(store: Path, folder: Path) -> str:
    import torch

    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.train.loop import fit
    from ntp.engine.train.setup import setup

    cfg = TrainConfig(store=str(store), epochs=1, hidden=64, model_out=str(folder / "model.pt"))
    fit(setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None)), sinks=[])
    return cfg.model_out


def predict(model: str, store: Path, out: Path, nproc: int, chunk_rows: int | None) -> tuple[float, dict]:
    """Wall seconds of the whole command, and rank 0's phases (load, forward, write) from its report line."""
    from ntp.engine.infer.predict import Request
    from ntp.run.inference_job import inference_spec, run_inference

    lines: list[str] = []
    t0 = time.perf_counter()
    spec = inference_spec(
        model, store, nproc=nproc, launch={"device": "cpu", "job_timeout_s": 1800}, chunk_rows=chunk_rows
    )
    run_inference(spec, Request(model=model, out=str(out)), overwrite=True, on_line=lines.append)  # any rank count
    wall = time.perf_counter() - t0
    phases = dict(re.findall(r"(load|forward|write) ([0-9.]+) s", "\n".join(lines)))
    return wall, {f"{name}_s": float(value) for name, value in phases.items()}


def train_epoch_wall(store: Path, nproc: int) -> float:
    """A 1-epoch training job of the same model on the same launcher: what launching and loading cost."""
    from ntp.config import TrainConfig
    from ntp.run.launch import launch_training
    from ntp.spec import resolve

    t0 = time.perf_counter()
    cfg = TrainConfig(store=str(store), epochs=1, hidden=64, mode="tp" if nproc > 1 else "single")
    launch_training(resolve(cfg, nproc=nproc, device="cpu", job_timeout_s=1800), on_line=lambda line: None)
    return time.perf_counter() - t0


def main() -> None:
    p = base_parser(__doc__, threads=False)
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--avg-degree", type=float, default=20)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    args = p.parse_args()
    nodes, degree = (100_000, 10) if args.quick else (args.nodes, args.avg_degree)
    store = synthetic_store(nodes, degree)
    import pandas as pd

    rows = []
    with tempfile.TemporaryDirectory(prefix="ntp-bench-inference-") as tmp:
        folder = Path(tmp)
        model = train_model(store, folder)
        reference = None
        for nproc in args.ranks:
            train_s = round(train_epoch_wall(store, nproc), 2)
            for chunk_rows in (None, nodes // 8):
                out = folder / f"p{nproc}-{chunk_rows}"
                wall, phases = predict(model, store, out, nproc, chunk_rows)
                frame = pd.read_parquet(out)
                probs = np.stack(frame["prob"].to_numpy())
                if reference is None:
                    reference = (frame["pred"].to_numpy(), probs)
                same = bool(
                    (frame["pred"].to_numpy() == reference[0]).all() and np.allclose(probs, reference[1], atol=1e-5)
                )
                size = sum(f.stat().st_size for f in out.glob("*.parquet"))
                rows.append(
                    {
                        "ranks": nproc,
                        "chunks": 8 if chunk_rows else 1,
                        "wall_s": round(wall, 2),
                        **phases,
                        "train_1_epoch_wall_s": train_s,
                        "nodes_per_s": int(nodes / wall),
                        "export_MiB": round(size / 2**20, 1),
                        "equal_to_1_rank": same,
                    }
                )
                shutil.rmtree(out)
    report("inference", rows, {"nodes": nodes, "avg_degree": degree, "features": 128, "classes": 16, "hidden": 64})


if __name__ == "__main__":
    main()
