"""`ntp compare RUN_ID... | --experiment NAME`: training runs side by side (one column per run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

#: (row label, how to get the value from a run, format)
ROWS: list[tuple[str, str, str]] = [
    ("experiment", "experiment", "s"),
    ("status", "status", "s"),
    ("dataset", "param:data.name", "s"),
    ("store fingerprint", "param:store_fingerprint", "digest"),
    ("model", "param:model", "s"),
    ("arch", "param:arch", "s"),
    ("mode", "param:mode", "s"),
    ("world size", "param:world_size", "s"),
    ("hidden", "param:hidden", "s"),
    ("nn layers / prop steps", "layers", "s"),
    ("epochs run", "metric:epochs_run", "int"),
    ("epoch time median (s)", "metric:epoch_s_median", "time"),
    ("bytes per rank per epoch", "metric:bytes_per_rank_per_epoch", "bytes"),
    ("compute max/min (s/epoch)", "pair:compute_s", "time"),
    ("comm max/min (s/epoch)", "pair:comm_s", "time"),
    ("bytes max/min (per epoch)", "pair:bytes_sent_per_epoch", "bytes"),
    ("compute balance (max/min)", "metric:compute_balance", "ratio"),
    ("bytes balance (max/min)", "metric:bytes_balance", "ratio"),
    ("best valid metric", "metric:best_valid_metric", "metric"),
    ("final test metric", "metric:final_test_metric", "metric"),
    ("eval test metric", "metric:eval/test", "metric"),
]


def _fmt(value: Any, kind: str) -> str:
    if value is None or value == "":
        return "-"
    if kind == "s":
        return str(value)
    if kind == "digest":  # as MLflow shows a dataset's digest
        return str(value)[:12]
    v = float(value)
    if kind == "int":
        return str(int(v))
    if kind == "time":
        return f"{v:.4g}"
    if kind == "ratio":
        return f"{v:.2f}"
    if kind == "metric":
        return f"{v:.4f}"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
        v /= 1024
    return str(v)


def _value(run: Any, how: str, kind: str, experiments: dict[str, str]) -> str:
    params, metrics = run.data.params, run.data.metrics
    if how == "experiment":
        return experiments.get(run.info.experiment_id, run.info.experiment_id)
    if how == "status":
        return run.info.status
    if how == "layers":
        return f"{params.get('nn_layers', '-')} / {params.get('prop_steps', '-')}"
    source, _, key = how.partition(":")
    if source == "param":
        return _fmt(params.get(key), kind)
    if source == "metric":
        return _fmt(metrics.get(key), kind)
    hi, lo = metrics.get(f"{key}_max"), metrics.get(f"{key}_min")
    return f"{_fmt(hi, kind)} / {_fmt(lo, kind)}"


def find_runs(
    run_ids: Sequence[str] = (), experiment: str | None = None, *, uri: str | None = None, limit: int = 20
) -> list[Any]:
    """The runs named by id, or the newest training (parent) runs of an experiment."""
    from ntp.run import tracking  # MLflow: only when the command runs

    c = tracking.client(uri)
    if experiment:
        exp = c.get_experiment_by_name(experiment)
        if exp is None:
            names = ", ".join(e.name for e in c.search_experiments())
            raise LookupError(f"no MLflow experiment named {experiment!r}; experiments: {names or 'none'}")
        return c.search_runs(
            [exp.experiment_id],
            f"tags.`{tracking.TAG_KIND}` = 'train'",
            order_by=["attributes.start_time DESC"],
            max_results=limit,
        )
    from mlflow.exceptions import MlflowException

    runs = []
    for rid in run_ids:
        try:
            runs.append(c.get_run(rid))
        except MlflowException as exc:
            raise LookupError(f"no MLflow run {rid!r} at {tracking.tracking_uri() if uri is None else uri}") from exc
    return runs


def compare_table(runs: Sequence[Any], *, uri: str | None = None) -> str:
    """A plain-text table: one row per quantity, one column per run."""
    from ntp.run import tracking

    c = tracking.client(uri)
    experiments = {r.info.experiment_id: "" for r in runs}
    for eid in experiments:
        experiments[eid] = c.get_experiment(eid).name
    header = ["run"] + [f"{r.info.run_id[:8]} {r.info.run_name or ''}".strip() for r in runs]
    body = [[label] + [_value(r, how, kind, experiments) for r in runs] for label, how, kind in ROWS]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_compare(args: argparse.Namespace) -> int:
    """The `compare` command: print the table; exit 2 when nothing matches."""
    if not args.run_ids and not args.experiment:
        print("error: give RUN_ID... or --experiment NAME", file=sys.stderr)
        return 2
    try:
        runs = find_runs(args.run_ids, args.experiment, uri=args.tracking_uri, limit=args.limit)
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: experiment {args.experiment!r} has no training runs", file=sys.stderr)
        return 2
    print(compare_table(runs, uri=args.tracking_uri))
    return 0


def add_compare_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `compare` on an argparse subparsers object (``func`` returns the exit code)."""
    p = subparsers.add_parser(
        "compare",
        help="Compare MLflow training runs side by side",
        description="Epoch time, bytes per rank, balance (max/min) and metrics of training runs, one column per run.",
    )
    p.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="MLflow run ids (parent training runs)")
    p.add_argument("--experiment", help="compare the newest training runs of this experiment instead")
    p.add_argument("--limit", type=int, default=10, help="with --experiment: at most this many runs (default 10)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite under the data directory)",
    )
    p.set_defaults(func=run_compare)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ntp")
    add_compare_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
