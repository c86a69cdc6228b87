"""MLflow tracking of training jobs: one parent run per job, one child run per worker.

The results file written by rank 0 (JSON lines, see ``ntp.train``) is the single source of what is logged:
per-epoch metrics and max/min worker summaries in the parent run, per-epoch timing per worker in the child runs,
a timing table (Parquet and CSV), plots, the resolved config, the model and the dataset.

The tracking URI is ``$MLFLOW_TRACKING_URI`` when set (a real server), else a sqlite database in the data
directory. Nothing here imports Prefect.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Tag keys (the mlflow.* ones are MLflow's own).
TAG_KIND = "ntp.kind"  # "train" (parent), "worker" (child), "evaluate"
TAG_FLOW_RUN = "prefect.flow_run_id"
TAG_GIT = "git_commit"
TAG_PARENT = "mlflow.parentRunId"
TAG_ERROR = "ntp.error"

MODEL_DIR = "model"
_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch call


def _data_dir() -> Path:
    try:
        from storage import default_data_dir
    except ImportError:  # storage not importable: same rule as storage.default_data_dir
        return Path(os.environ.get("NTP_DATA_DIR", "data"))
    return Path(default_data_dir())


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<data dir>/mlflow.db`` (the directory is created)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    data = _data_dir().resolve()
    data.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data / 'mlflow.db'}"


def client(uri: str | None = None) -> Any:
    """An ``MlflowClient`` for ``uri`` (default: :func:`tracking_uri`)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri or tracking_uri())


def experiment_id(name: str, mlflow_client: Any = None) -> str:
    """Id of experiment ``name``, created when missing (safe when two jobs create it at once)."""
    from mlflow.exceptions import MlflowException

    c = mlflow_client or client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=_artifact_location(c.tracking_uri, name))
    except MlflowException:
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _artifact_location(uri: str, name: str) -> str | None:
    """Next to a sqlite database: ``<db dir>/mlartifacts/<name>`` (MLflow's default is ./mlruns in the current
    directory, wherever that is). A server decides for itself (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "experiment"
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / safe).resolve().as_uri()


def run_url(run_id: str, uri: str | None = None) -> str:
    """A link to the run: the server page for http(s) URIs, else an ``mlflow ui`` hint."""
    uri = uri or tracking_uri()
    c = client(uri)
    exp = c.get_run(run_id).info.experiment_id
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}"
    return f"mlflow ui --backend-store-uri {uri}  ->  http://127.0.0.1:5000/#/experiments/{exp}/runs/{run_id}"


def git_commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the git checkout holding this package (or ``cwd``), or None."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# ----------------------------------------------------------------------------------------------------------------
# The results file


@dataclass
class Results:
    """A parsed results file: epoch records, then the final record (None while running or after a crash)."""

    epochs: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None

    @property
    def world_size(self) -> int:
        return max((len(e.get("workers", [])) for e in self.epochs), default=0)


def read_results(path: str | Path) -> Results:
    """Parse a results file; a truncated last line (a crash while writing) is ignored."""
    res = Results()
    p = Path(path)
    if not p.is_file():
        return res
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("final"):
            res.final = rec
        elif "epoch" in rec:
            res.epochs.append(rec)
    return res


def _kinds(results: Results, key: str) -> list[str]:
    kinds: set[str] = set()
    for e in results.epochs:
        for w in e.get("workers", []):
            kinds.update((w.get(key) or {}).keys())
    return sorted(kinds)


def timing_table(results: Results) -> Any:
    """One row per (epoch, rank): compute, communication per kind, bytes per kind, totals, peak memory."""
    import pandas as pd

    comm_kinds = _kinds(results, "comm_s")
    byte_kinds = sorted(set(_kinds(results, "bytes_sent")) | set(_kinds(results, "bytes_recv")))
    rows = []
    for e in results.epochs:
        for w in e.get("workers", []):
            comm, sent, recv = w.get("comm_s") or {}, w.get("bytes_sent") or {}, w.get("bytes_recv") or {}
            row: dict[str, Any] = {"epoch": e["epoch"], "rank": w["rank"], "epoch_s": e.get("epoch_s"),
                                   "compute_s": float(w.get("compute_s", 0.0))}
            row.update({f"comm_s_{k}": float(comm.get(k, 0.0)) for k in comm_kinds})
            row["comm_s_total"] = float(sum(comm.values()))
            row.update({f"bytes_sent_{k}": int(sent.get(k, 0)) for k in byte_kinds})
            row.update({f"bytes_recv_{k}": int(recv.get(k, 0)) for k in byte_kinds})
            row["bytes_sent_total"] = int(sum(sent.values()))
            row["bytes_recv_total"] = int(sum(recv.values()))
            row["peak_mem_bytes"] = int(w.get("peak_mem_bytes", 0))
            row.update(_chunking_fields(w))
            rows.append(row)
    columns = ["epoch", "rank", "epoch_s", "compute_s"]
    return pd.DataFrame(rows, columns=columns + [c for c in (rows[0] if rows else {}) if c not in columns])


def _ratio(hi: float, lo: float) -> float:
    return hi / lo if lo > 0 else (1.0 if hi == 0 else float("inf"))


def summarize(results: Results) -> dict[str, float]:
    """Job-level numbers: median epoch time, per-rank means over epochs, max/min balance, final metrics."""
    out: dict[str, float] = {"epochs_run": float(len(results.epochs))}
    if results.epochs:
        out["epoch_s_median"] = float(statistics.median(e["epoch_s"] for e in results.epochs))
        table = timing_table(results)
        if len(table):
            per_rank = table.groupby("rank")[["compute_s", "comm_s_total", "bytes_sent_total", "bytes_recv_total",
                                              "peak_mem_bytes"]].mean()
            for col, name in [("compute_s", "compute_s"), ("comm_s_total", "comm_s"),
                              ("bytes_sent_total", "bytes_sent_per_epoch"), ("peak_mem_bytes", "peak_mem_bytes")]:
                out[f"{name}_max"] = float(per_rank[col].max())
                out[f"{name}_min"] = float(per_rank[col].min())
            out["bytes_per_rank_per_epoch"] = float(per_rank["bytes_sent_total"].mean())
            out["compute_balance"] = _ratio(out["compute_s_max"], out["compute_s_min"])
            out["bytes_balance"] = _ratio(out["bytes_sent_per_epoch_max"], out["bytes_sent_per_epoch_min"])
    if results.final:
        for key in ("best_epoch", "best_valid_metric", "test_metric"):
            if results.final.get(key) is not None:
                out["final_" + key if key == "test_metric" else key] = float(results.final[key])
    return out


def epoch_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Parent-run metrics of one epoch record: loss, metrics, epoch time, max/min over workers."""
    out = {k: float(record[k]) for k in ("loss", "train_metric", "valid_metric", "test_metric", "epoch_s")
           if record.get(k) is not None}
    workers = record.get("workers") or []
    if workers:
        values = {
            "compute_s": [float(w.get("compute_s", 0.0)) for w in workers],
            "comm_s": [float(sum((w.get("comm_s") or {}).values())) for w in workers],
            "bytes_sent": [float(sum((w.get("bytes_sent") or {}).values())) for w in workers],
            "bytes_recv": [float(sum((w.get("bytes_recv") or {}).values())) for w in workers],
            "peak_mem_bytes": [float(w.get("peak_mem_bytes", 0)) for w in workers],
        }
        for name, vals in values.items():
            out[f"workers/{name}_max"] = max(vals)
            out[f"workers/{name}_min"] = min(vals)
    return out


def worker_metrics(worker: Mapping[str, Any]) -> dict[str, float]:
    """Child-run metrics of one worker in one epoch."""
    out = {"compute_s": float(worker.get("compute_s", 0.0)), "peak_mem_bytes": float(worker.get("peak_mem_bytes", 0))}
    for key in ("comm_s", "bytes_sent", "bytes_recv"):
        parts = worker.get(key) or {}
        out[f"{key}_total"] = float(sum(parts.values()))
        out.update({f"{key}/{kind}": float(v) for kind, v in parts.items()})
    out.update({k.replace("peak_mem_", "peak_mem/"): v for k, v in _chunking_fields(worker).items()})
    return out


def _chunking_fields(worker: Mapping[str, Any]) -> dict[str, float]:
    """Chunks, communication overlapped with compute, CPU seconds and peak memory per phase, where recorded."""
    out = {k: float(worker[k]) for k in ("chunks", "overlap_s", "cpu_s") if worker.get(k) is not None}
    out.update({f"peak_mem_{phase}": float(v) for phase, v in (worker.get("peak_mem_by_phase") or {}).items()})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Plots


def plot_curves(results: Results, path: str | Path) -> Path:
    """Loss curve and train/valid/test metric curves, one PNG."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    ax_loss, ax_metric = fig.subplots(1, 2)
    epochs = [e["epoch"] for e in results.epochs]
    ax_loss.plot(epochs, [e.get("loss") for e in results.epochs], color="tab:red")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="Training loss")
    plotted = False
    for key, label in [("train_metric", "train"), ("valid_metric", "valid"), ("test_metric", "test")]:
        pts = [(e["epoch"], e[key]) for e in results.epochs if e.get(key) is not None]
        if pts:
            ax_metric.plot(*zip(*pts), marker=".", label=label)
            plotted = True
    metric = (results.final or {}).get("metric") or "metric"
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


# ----------------------------------------------------------------------------------------------------------------
# Runs


def _metric_batches(metrics: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(metrics), _BATCH):
        yield metrics[i:i + _BATCH]


def _param_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text[:6000]


@dataclass
class TrainingRun:
    """A parent MLflow run of one training job; every method logs into it (no global active run)."""

    run_id: str
    experiment_id: str
    client: Any
    uri: str

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 90):
            self.client.log_batch(self.run_id, params=items[i:i + 90])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0, run_id: str | None = None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        for batch in _metric_batches(items):
            self.client.log_batch(run_id or self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k, v in tags.items():
            if v is not None:
                self.client.set_tag(self.run_id, k, str(v))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_dataset(self, store_path: str | Path, meta: Mapping[str, Any]) -> None:
        """The store as an MLflow dataset: source = store path, digest = store fingerprint."""
        import mlflow.data  # registers the artifact dataset sources
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.data.sources import LocalArtifactDatasetSource
        from mlflow.entities import DatasetInput, InputTag

        source = LocalArtifactDatasetSource(str(Path(store_path).resolve()))
        digest = str(meta.get("fingerprint") or "")[:36] or None
        ds = MetaDataset(source=source, name=str(meta.get("name") or Path(store_path).name), digest=digest)
        self.client.log_inputs(self.run_id, [DatasetInput(ds._to_mlflow_entity(),
                                                          tags=[InputTag("mlflow.data.context", "train")])])

    def log_results(self, results_path: str | Path, status: str = "FINISHED") -> dict[str, float]:
        """Per-epoch metrics, one child run per worker (ended with ``status``: a failed job's workers are FAILED),
        timing table, plots; returns :func:`summarize`."""
        results = read_results(results_path)
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, v, ts, e["epoch"]) for e in results.epochs for k, v in epoch_metrics(e).items()]
        for batch in _metric_batches(items):
            self.client.log_batch(self.run_id, metrics=batch)
        summary = summarize(results)
        self.log_metrics(summary)
        self._log_workers(results, status)
        with tempfile.TemporaryDirectory() as tmp:
            self.log_artifact(results_path, "results")
            if results.epochs:
                table = timing_table(results)
                table.to_parquet(Path(tmp) / "worker_timing.parquet", index=False)
                table.to_csv(Path(tmp) / "worker_timing.csv", index=False)
                plot_curves(results, Path(tmp) / "curves.png")
                plot_workers(results, Path(tmp) / "workers.png")
                for name in ("worker_timing.parquet", "worker_timing.csv"):
                    self.log_artifact(Path(tmp) / name, "timing")
                for name in ("curves.png", "workers.png"):
                    self.log_artifact(Path(tmp) / name, "plots")
        return summary

    def _log_workers(self, results: Results, status: str) -> None:
        from mlflow.entities import Metric

        ranks = sorted({w["rank"] for e in results.epochs for w in e.get("workers", [])})
        existing = {r.data.tags.get("ntp.rank"): r.info.run_id for r in self.children()}
        for rank in ranks:
            child = existing.get(str(rank))
            if child is None:
                child = self.client.create_run(
                    self.experiment_id, run_name=f"rank-{rank}",
                    tags={TAG_PARENT: self.run_id, TAG_KIND: "worker", "ntp.rank": str(rank)}).info.run_id
                self.client.log_param(child, "rank", rank)
            ts = int(time.time() * 1000)
            items = [Metric(k, v, ts, e["epoch"]) for e in results.epochs for w in e.get("workers", [])
                     if w["rank"] == rank for k, v in worker_metrics(w).items()]
            for batch in _metric_batches(items):
                self.client.log_batch(child, metrics=batch)
            self.client.set_terminated(child, status)

    def children(self) -> list[Any]:
        """The child (per-worker) runs."""
        return self.client.search_runs([self.experiment_id], f"tags.`{TAG_PARENT}` = '{self.run_id}'",
                                       max_results=1000)

    def log_model(self, model_path: str | Path, *, config: Mapping[str, Any],
                  store_meta: Mapping[str, Any] | None = None) -> None:
        """The model file plus ``model.json``: what it is and how to rebuild and evaluate it."""
        model_path = Path(model_path)
        info = {
            "file": model_path.name,
            "format": "torch.save dict (ntp.checkpoint.load reads it): config (TrainConfig), state_dict (the best "
                      "model's weights), in_dim, out_dim, store_fingerprint, metric, best_epoch",
            "config": dict(config),
            "store_fingerprint": (store_meta or {}).get("fingerprint"),
            "store_name": (store_meta or {}).get("name"),
            "rebuild": "ntp.evaluate.evaluate_model(<model file>, <store path>) rebuilds the model from its config "
                       "and weights and evaluates it (or: ntp evaluate); the store must have the fingerprint above",
            "evaluate_flow": f"flows.evaluate.evaluate(run_id='{self.run_id}')",
        }
        self.log_artifact(model_path, MODEL_DIR)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "model.json"
            p.write_text(json.dumps(info, indent=2, default=str))
            self.log_artifact(p, MODEL_DIR)
        self.set_tags({"ntp.model_file": f"{MODEL_DIR}/{model_path.name}"})

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The resolved configuration as config.json and config.yaml."""
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(dict(config), indent=2, default=str))
            (Path(tmp) / "config.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(dict(config), default=str)),
                                                                  sort_keys=False))
            self.log_artifact(Path(tmp) / "config.json", "config")
            self.log_artifact(Path(tmp) / "config.yaml", "config")

    @property
    def url(self) -> str:
        return run_url(self.run_id, self.uri)


def _monitor(run_id: str, uri: str, interval_s: float) -> Any:
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        mon = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1, tracking_uri=uri)
        mon.start()
        return mon
    except Exception:  # system metrics are best effort (psutil missing, ...)
        return None


@contextmanager
def start_training_run(
    config: Mapping[str, Any],
    *,
    world_size: int,
    store_meta: Mapping[str, Any] | None = None,
    store_path: str | Path | None = None,
    experiment: str | None = None,
    run_name: str | None = None,
    flow_run_id: str | None = None,
    tags: Mapping[str, Any] | None = None,
    system_metrics: bool = True,
    system_metrics_interval_s: float = 2.0,
    uri: str | None = None,
) -> Iterator[TrainingRun]:
    """A parent run for one training job, FINISHED on normal exit and FAILED (with the error as a tag) on any
    exception, which is re-raised. Params: every config field, world size, store fingerprint."""
    uri = uri or tracking_uri()
    c = client(uri)
    meta = dict(store_meta or {})
    exp_name = experiment or meta.get("name") or "ntp"
    exp_id = experiment_id(exp_name, c)
    commit = git_commit()
    run_tags = {TAG_KIND: "train", TAG_FLOW_RUN: flow_run_id, TAG_GIT: commit, "mlflow.source.git.commit": commit,
                "mlflow.source.name": "ntp", **(tags or {})}
    run = c.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in run_tags.items() if v is not None})
    tr = TrainingRun(run.info.run_id, exp_id, c, uri)
    monitor = None
    try:
        params = {**dict(config), "world_size": world_size, "store_fingerprint": meta.get("fingerprint")}
        params.update({f"data.{k}": v for k, v in meta.items()
                       if isinstance(v, (int, float, str, bool)) and k not in ("fingerprint",)})
        tr.log_params(params)
        tr.log_config({**dict(config), "world_size": world_size})
        if store_path is not None:
            tr.log_dataset(store_path, meta)
        if system_metrics:
            monitor = _monitor(tr.run_id, uri, system_metrics_interval_s)
        yield tr
    except BaseException as exc:
        if monitor is not None:
            monitor.finish()
            monitor = None
        try:
            c.set_tag(tr.run_id, TAG_ERROR, f"{type(exc).__name__}: {exc}"[-4900:])
        finally:
            c.set_terminated(tr.run_id, "FAILED")
        raise
    else:
        if monitor is not None:
            monitor.finish()
        c.set_terminated(tr.run_id, "FINISHED")


def log_evaluation(run_id: str | None, metrics: Mapping[str, Any], *, model_path: str | Path | None = None,
                   store: str | Path | None = None, experiment: str | None = None, prefix: str = "eval",
                   uri: str | None = None) -> str:
    """Log ``evaluate_model`` output (``{"train", "valid", "test", "metric"}``) as ``eval/<split>`` metrics into
    ``run_id``, or into a new FINISHED run of kind "evaluate" (experiment: given, else the store's name)."""
    from mlflow.entities import Metric

    c = client(uri)
    if run_id is None:
        name = experiment or _store_name(store) or "ntp"
        run = c.create_run(experiment_id(name, c), run_name=f"evaluate-{Path(str(model_path)).stem}",
                           tags={TAG_KIND: "evaluate", TAG_GIT: git_commit() or ""})
        run_id = run.info.run_id
        c.log_param(run_id, "model_path", str(model_path))
        c.log_param(run_id, "store", str(store))
        finish = True
    else:
        finish = False
    ts = int(time.time() * 1000)
    items = [Metric(f"{prefix}/{k}", float(v), ts, 0) for k, v in metrics.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    c.log_batch(run_id, metrics=items)
    if metrics.get("metric"):
        c.set_tag(run_id, f"{prefix}.metric", str(metrics["metric"]))
    if finish:
        c.set_terminated(run_id, "FINISHED")
    return run_id


def _store_name(store: str | Path | None) -> str | None:
    if store is None:
        return None
    try:
        from storage import open_store

        return open_store(store).meta.name
    except Exception:
        return Path(str(store)).name


def run_store(run_id: str, uri: str | None = None) -> str:
    """The store path a training run used (its ``store`` param)."""
    return client(uri).get_run(run_id).data.params["store"]


def download_model(run_id: str, dst: str | Path, *, uri: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The model file logged in ``run_id`` (downloaded into ``dst``) and its ``model.json``."""
    import mlflow.artifacts

    uri = uri or tracking_uri()
    local = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=MODEL_DIR, dst_path=str(dst),
                                                     tracking_uri=uri))
    info = json.loads((local / "model.json").read_text())
    return local / info["file"], info


# ----------------------------------------------------------------------------------------------------------------
# A tracked training job (the body of the Prefect `train` task)


@dataclass
class TrackedTraining:
    """What a tracked job produced."""

    run_id: str | None
    results_path: Path
    model_path: Path | None
    wall_s: float
    summary: dict[str, float]
    world_size: int
    config: dict[str, Any] = field(default_factory=dict)


def train_tracked(
    cfg: Any,
    *,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    timeout_s: float | None = None,
    experiment: str | None = None,
    run_name: str | None = None,
    flow_run_id: str | None = None,
    on_line: Callable[[str], None] = print,
    system_metrics: bool = True,
) -> TrackedTraining:
    """Launch ``cfg`` (a TrainConfig) with :func:`ntp.launch.launch_training` inside a parent MLflow run.

    Results and model go to ``<data dir>/runs/<run id>/`` unless the config names them. Whatever the results
    file holds is logged even when training fails; the run then ends FAILED and the error is re-raised.
    Only node rank 0 tracks (other nodes just train).
    """
    from ntp.launch import launch_training

    launch = dict(nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                  timeout_s=timeout_s, on_line=on_line)
    world_size = 1 if cfg.mode == "single" else nproc * nnodes
    if node_rank != 0:
        res = launch_training(cfg, **launch)
        return TrackedTraining(None, Path(res.results_path), res.model_path, res.wall_s, {}, world_size, cfg.to_dict())

    from storage import open_store

    meta = open_store(cfg.store).meta.to_dict()
    with start_training_run(cfg.to_dict(), world_size=world_size, store_meta=meta, store_path=cfg.store,
                            experiment=experiment, run_name=run_name, flow_run_id=flow_run_id,
                            system_metrics=system_metrics, tags={"ntp.nnodes": nnodes, "ntp.nproc": nproc}) as run:
        run_dir = _data_dir().resolve() / "runs" / run.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = cfg.replace(results=cfg.results or str(run_dir / "results.jsonl"),
                          model_out=cfg.model_out or str(run_dir / "model.pt"))
        run.set_tags({"ntp.results": cfg.results, "ntp.model_out": cfg.model_out})  # params hold the requested values
        try:
            res = launch_training(cfg, **launch)
        except BaseException:
            if Path(cfg.results).is_file():
                try:
                    run.log_results(cfg.results, status="FAILED")
                except Exception as log_exc:  # never hide the training error behind a logging error
                    on_line(f"warning: could not log partial results: {log_exc}")
            raise
        summary = run.log_results(res.results_path)
        model_path = Path(res.model_path) if res.model_path else None
        if model_path is not None and model_path.is_file():
            run.log_model(model_path, config=cfg.to_dict(), store_meta=meta)
        run.log_metrics({"wall_s": res.wall_s})
    return TrackedTraining(run.run_id, Path(res.results_path), model_path, res.wall_s, summary, world_size,
                           cfg.to_dict())
