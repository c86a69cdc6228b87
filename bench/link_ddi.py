"""ogbl-ddi link prediction (Hits@20) against the OGB leaderboard's full-graph baselines, same model sizes.

OGB's examples/linkproppred/ddi/gnn.py: 2 GNN layers of width 256 on learned node embeddings (xavier init), dropout
0.5 between the layers (none on the embeddings), the LinkPredictor MLP (2 layers, width 256) on h_u * h_v, Adam lr
0.005, batches of 64 * 1024 training edges with as many negatives (every step reruns the encoder on the whole
graph), gradients clipped to 1.0 per group, 200 epochs, evaluation every 5, the test Hits@20 at the best validation
epoch. Leaderboard: GCN 37.07 +- 5.07, GraphSAGE 53.90 +- 4.74 (10 seeds each).

  python bench/link_ddi.py --epochs 200 --seeds 0 1 2 3 4      the OGB protocol
  python bench/link_ddi.py --quick                              2 epochs of GCN, one seed (a smoke run)

Prints a table (one row per model and seed, then mean and spread per model), saves it under bench/out/ and logs it to
MLflow's 'benchmarks' experiment. Each run is one `ntp train` job (torchrun, ``--nproc`` ranks).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import yaml
from common import DATASETS, REPO, base_parser, report

OGB_LEADERBOARD = {"gcn": (37.07, 5.07), "sage": (53.90, 4.74)}  # test Hits@20 (%), mean +- std over 10 seeds


def _ogb_example() -> dict:
    """OGB's example settings as recipes/ogbl-ddi-sage.yaml holds them, less what this script's options choose (the
    model, the epochs, the evaluation interval)."""
    sections = yaml.safe_load((REPO / "recipes" / "ogbl-ddi-sage.yaml").read_text())
    flat = {key: value for name in ("gnn", "optim", "link") for key, value in sections[name].items()}
    return {key: value for key, value in flat.items() if key not in ("model", "epochs", "eval_every")}


OGB_EXAMPLE = _ogb_example()


def ddi_store() -> Path:
    from storage import prepare

    return prepare("ogbl-ddi", from_dir=DATASETS / "ogb-link" / "ogbl-ddi", progress=lambda line: None)


def run_one(
    store: Path,
    model: str,
    seed: int,
    epochs: int,
    eval_every: int,
    nproc: int,
    out: Path | None = None,
    precision: str = "fp32",
    threads: int = 0,
) -> dict:
    """One run; with ``out``, its results file and checkpoints stay there (``--resume`` continues it) and its
    epochs are printed as they end."""
    from ntp.config import TrainConfig
    from ntp.run.launch import launch_training
    from ntp.spec import resolve

    with tempfile.TemporaryDirectory() as tmp:
        name = f"{model}-seed{seed}" + ("" if precision == "fp32" else f"-{precision}")
        folder = out / name if out else Path(tmp)
        results = folder / "results.jsonl"
        cfg = TrainConfig(
            store=str(store),
            model=model,
            seed=seed,
            epochs=epochs,
            eval_every=eval_every,
            results=str(results),
            mode="single" if nproc == 1 else "tp",
            precision=precision,
            threads=threads,
            **OGB_EXAMPLE,
            checkpoint_dir=str(folder / "ckpt") if out else None,
            checkpoint_every=1,
            resume=bool(out),
        )
        show = (lambda line: print(line, flush=True)) if out else (lambda line: None)
        launch_training(resolve(cfg, nproc=nproc, job_timeout_s=24 * 3600), on_line=show)
        recs = [json.loads(line) for line in results.read_text().splitlines()]
    epochs_recs = [r for r in recs if "epoch" in r]
    final = next(r for r in recs if r.get("final"))
    curve = {r["epoch"] + 1: round(100 * r["valid_metric"], 2) for r in epochs_recs if r["valid_metric"] is not None}
    return {
        "model": model,
        "precision": precision,
        "seed": seed,
        "epochs": len(epochs_recs),
        "ranks": nproc,
        "best_epoch": final["best_epoch"] + 1,
        "valid_hits@20": 100 * final["best_valid_metric"],
        "test_hits@20": 100 * final["test_metric"],
        "epoch_s": statistics.median(r["epoch_s"] for r in epochs_recs),
        "final_loss": epochs_recs[-1]["loss"],
        "valid_curve": json.dumps(curve),
    }


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--models", nargs="+", default=["gcn", "sage"], choices=["gcn", "sage"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--epochs", type=int, default=200, help="OGB's example: 200")
    p.add_argument("--eval-every", type=int, default=5, help="OGB's example: 5")
    p.add_argument("--nproc", type=int, default=1, help="ranks per run (tensor parallel when > 1)")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: the encoder in bfloat16 (the embeddings and the decoder stay float32)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="keep each run's results and checkpoints in OUT/<model>-seed<seed>/ (with "
        "-bf16 under bf16) and print its epochs; a run found there is resumed from its last checkpoint",
    )
    args = p.parse_args()
    if args.quick:
        args.models, args.seeds, args.epochs, args.eval_every = ["gcn"], [0], 2, 1
    store = ddi_store()
    settings = dict(
        epochs=args.epochs,
        eval_every=args.eval_every,
        nproc=args.nproc,
        precision=args.precision,
        threads=args.threads or 0,
    )
    rows = []
    for model in args.models:
        runs = []
        for seed in args.seeds:
            row = run_one(store, model, seed, out=args.out, **settings)
            print(json.dumps(row), flush=True)
            runs.append(row)
        tests = [r["test_hits@20"] for r in runs]
        ref = OGB_LEADERBOARD[model]
        rows += runs + [
            {
                "model": f"{model} (mean of {len(runs)})",
                "precision": args.precision,
                "epochs": args.epochs,
                "test_hits@20": statistics.mean(tests),
                "test_std": statistics.stdev(tests) if len(tests) > 1 else None,
                "ogb_200_epochs": f"{ref[0]} +- {ref[1]}",
            }
        ]
    report(
        "link_ddi",
        rows,
        {"seeds": args.seeds, **settings, **OGB_EXAMPLE},
        columns=[
            "model",
            "precision",
            "seed",
            "epochs",
            "ranks",
            "best_epoch",
            "valid_hits@20",
            "test_hits@20",
            "test_std",
            "ogb_200_epochs",
            "epoch_s",
            "final_loss",
            "valid_curve",
        ],
    )


if __name__ == "__main__":
    main()
