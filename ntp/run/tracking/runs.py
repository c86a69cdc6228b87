"""MLflow runs of ntp: a parent run per training job (with one child run per worker), and evaluation runs.

Every method logs into an explicit run id (no global active run), so several jobs can log from one process.
"""

from __future__ import annotations

import json
import logging
import posixpath
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ntp.records import EpochRecord, Results, read_results
from ntp.run.tracking.guard import MONITOR_LOGGER, GuardedClient, QuietMonitor, TrackingGuard
from ntp.run.tracking.mlflow_store import (
    TAG_ERROR,
    TAG_FLOW_RUN,
    TAG_GIT,
    TAG_KIND,
    TAG_PARENT,
    client,
    experiment_id,
    git_commit,
    is_server,
    run_url,
    tracking_uri,
)
from ntp.run.tracking.orphans import close_orphaned_runs, end_status, launcher_tags, record_unended
from ntp.run.tracking.plots import curves_figure, memory_figure, workers_figure
from ntp.run.tracking.tables import epoch_metrics, summarize, timing_table, worker_metrics, worker_summary

MODEL_DIR = "model"
PLOTS_DIR = "plots"
TABLES_DIR = "tables"
_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch call


def _metric_batches(metrics: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(metrics), _BATCH):
        yield metrics[i : i + _BATCH]


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


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
    num_edges: int | None = None  #: the store's, for the bytes-per-edge summaries

    @property
    def lost(self) -> bool:
        """Whether its tracking server stopped answering (ntp.run.tracking.guard): what is left is not logged."""
        guard = getattr(self.client, "guard", None)
        return guard is not None and guard.lost

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 90):
            self.client.log_batch(self.run_id, params=items[i : i + 90])

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

    def log_dataset(self, store_path: str | Path, meta: Mapping[str, Any], context: str = "train") -> None:
        """The store as this run's MLflow dataset input (ntp.run.tracking.lineage)."""
        from ntp.run.tracking.lineage import log_store_input

        log_store_input(self.client, self.run_id, store_path, meta, context)

    def log_epochs(self, records: Sequence[EpochRecord]) -> None:
        """Per-epoch metrics of the parent run (step = epoch), in as few calls as MLflow allows."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, v, ts, e.epoch) for e in records for k, v in epoch_metrics(e).items()]
        for batch in _metric_batches(items):
            self.client.log_batch(self.run_id, metrics=batch)

    def log_results(
        self, results_path: str | Path, status: str = "FINISHED", num_edges: int | None = None
    ) -> dict[str, float]:
        """What the whole job shows once it ends: the summary (bytes per edge from ``num_edges``, default: the
        store's), one child run per worker (ended with ``status``: a failed job's workers are FAILED), the timing
        files, tables, figures and the results file. Per-epoch metrics are logged as the epochs happen
        (ntp.run.tracking.live). Returns :func:`summarize`."""
        results = read_results(results_path)
        summary = summarize(results, num_edges or self._num_edges())
        self.log_metrics(summary)
        self._log_workers(results, status)
        self.log_artifact(results_path, "results")
        if results.epochs:
            self._log_timing_files(results)
            self.log_table(worker_summary(results), f"{TABLES_DIR}/worker_summary.json")
            self.log_table(timing_table(results), f"{TABLES_DIR}/worker_timing.json")
            for name, figure in (("curves", curves_figure), ("workers", workers_figure), ("memory", memory_figure)):
                self.client.log_figure(self.run_id, figure(results), f"{PLOTS_DIR}/{name}.png")
        return summary

    def _num_edges(self) -> int | None:
        """The store's edge count: given at start, else the run's ``data.num_edges`` param."""
        if self.num_edges is None:
            self.num_edges = _as_int(self.client.get_run(self.run_id).data.params.get("data.num_edges"))
        return self.num_edges

    def _log_timing_files(self, results: Results) -> None:
        """The timing table as Parquet and CSV files (what scripts read; the JSON table is for the UI)."""
        with tempfile.TemporaryDirectory() as tmp:
            table = timing_table(results)
            table.to_parquet(Path(tmp) / "worker_timing.parquet", index=False)
            table.to_csv(Path(tmp) / "worker_timing.csv", index=False)
            for name in ("worker_timing.parquet", "worker_timing.csv"):
                self.log_artifact(Path(tmp) / name, "timing")

    def log_table(self, data: Any, artifact_file: str) -> None:
        """``MlflowClient.log_table`` (the UI shows it as a table), except that logging a table again replaces it:
        MLflow would append the rows to the existing file."""
        folder = posixpath.dirname(artifact_file) or None
        if not any(a.path == artifact_file for a in self.client.list_artifacts(self.run_id, folder)):
            self.client.log_table(self.run_id, data=data, artifact_file=artifact_file)
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / posixpath.basename(artifact_file)
            data.to_json(path, orient="split", index=False)  # log_table's own format
            self.log_artifact(path, folder)

    def _log_workers(self, results: Results, status: str) -> None:
        from mlflow.entities import Metric

        hosts = {w.rank: w.host for e in results.epochs for w in e.workers}
        existing = {r.data.tags.get("ntp.rank"): r.info.run_id for r in self.children()}
        for rank in sorted(hosts):
            child = existing.get(str(rank))
            if child is None:
                tags = {TAG_PARENT: self.run_id, TAG_KIND: "worker", "ntp.rank": str(rank), "ntp.host": hosts[rank]}
                child = self.client.create_run(self.experiment_id, run_name=f"rank-{rank}", tags=tags).info.run_id
                self.client.log_param(child, "rank", rank)
            ts = int(time.time() * 1000)
            items = [
                Metric(k, v, ts, e.epoch)
                for e in results.epochs
                for w in e.workers
                if w.rank == rank
                for k, v in worker_metrics(w).items()
            ]
            for batch in _metric_batches(items):
                self.client.log_batch(child, metrics=batch)
            self.client.set_terminated(child, status)

    def children(self) -> list[Any]:
        """The child (per-worker) runs."""
        return self.client.search_runs([self.experiment_id], f"tags.`{TAG_PARENT}` = '{self.run_id}'", max_results=1000)

    def log_model(
        self, model_path: str | Path, *, config: Mapping[str, Any], store_meta: Mapping[str, Any] | None = None
    ) -> None:
        """The model file plus ``model.json``: what it is and how to rebuild and evaluate it."""
        model_path = Path(model_path)
        info = {
            "file": model_path.name,
            "format": "torch.save dict (ntp.engine.train.checkpoint.load reads it): config (TrainConfig), state_dict (the best "
            "model's weights), in_dim, out_dim, store_fingerprint, metric, best_epoch",
            "config": dict(config),
            "store_fingerprint": (store_meta or {}).get("fingerprint"),
            "store_name": (store_meta or {}).get("name"),
            "rebuild": "ntp.engine.infer.inference.evaluate_model(<model file>, <store path>) rebuilds the model from its config "
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
            (Path(tmp) / "config.yaml").write_text(
                yaml.safe_dump(json.loads(json.dumps(dict(config), default=str)), sort_keys=False)
            )
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
    warn: Callable[[str], None] | None = None,
    lost_note: str = "",
) -> Iterator[TrainingRun]:
    """A parent run for one training job: FINISHED on normal exit, KILLED when interrupted (Ctrl-C, SIGTERM), FAILED
    on any other exception (with the error as a tag); the exception is re-raised. Params: every config field, world
    size, store fingerprint. Runs of this experiment whose launcher on this host died (SIGKILL) are closed first.
    With ``warn``, a server that stops answering once the run exists is said once (with ``lost_note``) and the
    rest is skipped (ntp.run.tracking.guard; the run's ``lost``); the next job of its experiment started on this
    host ends that run with the status and time this one recorded (ntp.run.tracking.orphans)."""
    uri = uri or tracking_uri()
    c = client(uri)
    meta = dict(store_meta or {})
    exp_name = experiment or meta.get("name") or "ntp"
    exp_id = experiment_id(exp_name, c)
    close_orphaned_runs(c, exp_id)
    run = c.create_run(exp_id, run_name=run_name, tags=_run_tags(meta, flow_run_id, tags))
    guard = TrackingGuard(uri, warn, lost_note) if warn is not None and is_server(uri) else None
    c = c if guard is None else GuardedClient(c, guard)
    tr = TrainingRun(run.info.run_id, exp_id, c, uri, _as_int(meta.get("num_edges")))
    monitor, quiet = None, None if guard is None else QuietMonitor(guard)
    try:
        tr.log_params(_run_params(config, world_size, meta))
        tr.log_config({**dict(config), "world_size": world_size})
        if store_path is not None:
            tr.log_dataset(store_path, meta)
        if system_metrics:
            monitor = _monitor(tr.run_id, uri, system_metrics_interval_s)
            if monitor is not None and guard is not None:  # it would flush to the lost server when it finishes
                guard.on_lost.append(monitor._shutdown_event.set)
                logging.getLogger(MONITOR_LOGGER).addFilter(quiet)
        yield tr
    except BaseException as exc:
        if monitor is not None and not tr.lost:
            monitor.finish()
            monitor = None
        try:
            c.set_tag(tr.run_id, TAG_ERROR, f"{type(exc).__name__}: {exc}"[-4900:])
        finally:
            c.set_terminated(tr.run_id, end_status(exc))
            if tr.lost:
                record_unended(tr.run_id, end_status(exc))
        raise
    else:
        if monitor is not None and not tr.lost:
            monitor.finish()
        c.set_terminated(tr.run_id, "FINISHED")
        if tr.lost:  # the next run on this host ends it (ntp.run.tracking.orphans)
            record_unended(tr.run_id, "FINISHED")
    finally:
        logging.getLogger(MONITOR_LOGGER).removeFilter(quiet)


def _run_tags(meta: Mapping[str, Any], flow_run_id: str | None, tags: Mapping[str, Any] | None) -> dict[str, str]:
    """A training run's tags: its kind, flow run, code version, task, launcher, and the caller's ``tags``."""
    commit = git_commit()
    run_tags = {
        TAG_KIND: "train",
        TAG_FLOW_RUN: flow_run_id,
        TAG_GIT: commit,
        "mlflow.source.git.commit": commit,
        "mlflow.source.name": "ntp",
        "ntp.task_type": meta.get("task_type"),
        "ntp.target_type": (meta.get("hetero") or {}).get("target"),
        **launcher_tags(),
        **(tags or {}),
    }
    return {k: str(v) for k, v in run_tags.items() if v is not None}


def _run_params(config: Mapping[str, Any], world_size: int, meta: Mapping[str, Any]) -> dict[str, Any]:
    """Every config field, the world size, and the store's fingerprint and scalar facts (``data.*``)."""
    params = {**dict(config), "world_size": world_size, "store_fingerprint": meta.get("fingerprint")}
    params |= {f"data.{k}": v for k, v in meta.items() if isinstance(v, (int, float, str, bool)) and k != "fingerprint"}
    if meta.get("hetero"):  # a heterogeneous store: its shape (the type and relation lists are in the config)
        params["data.node_types"] = len(meta["hetero"]["node_types"])
        params["data.relations"] = len(meta["hetero"]["relations"])
    return params


def log_evaluation(
    run_id: str | None,
    metrics: Mapping[str, Any],
    *,
    model_path: str | Path | None = None,
    store: str | Path | None = None,
    experiment: str | None = None,
    prefix: str = "eval",
    uri: str | None = None,
) -> str:
    """Log ``evaluate_model`` output (``{"train", "valid", "test", "metric"}``) as ``eval/<split>`` metrics into
    ``run_id``, or into a new FINISHED run of kind "evaluate" (experiment: given, else the store's name)."""
    from mlflow.entities import Metric

    c = client(uri)
    if run_id is None:
        name = experiment or _store_name(store) or "ntp"
        run = c.create_run(
            experiment_id(name, c),
            run_name=f"evaluate-{Path(str(model_path)).stem}",
            tags={TAG_KIND: "evaluate", TAG_GIT: git_commit() or ""},
        )
        run_id = run.info.run_id
        c.log_param(run_id, "model_path", str(model_path))
        c.log_param(run_id, "store", str(store))
        finish = True
    else:
        finish = False
    ts = int(time.time() * 1000)
    items = [
        Metric(f"{prefix}/{k}", float(v), ts, 0)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    c.log_batch(run_id, metrics=items)
    for key in ("metric", "task_type", "target_type"):
        if metrics.get(key):
            c.set_tag(run_id, f"{prefix}.{key}", str(metrics[key]))
    if store is not None:  # lineage: the store it was evaluated on (context "evaluation")
        _log_evaluated_store(c, run_id, store)
    if finish:
        c.set_terminated(run_id, "FINISHED")
    return run_id


def _log_evaluated_store(c: Any, run_id: str, store: str | Path) -> None:
    from ntp.run.tracking.lineage import log_store_input
    from storage import open_store

    try:
        meta = open_store(store).meta.to_dict()
    except Exception:  # the metrics are logged; a store that cannot be opened has no lineage to add
        return
    log_store_input(c, run_id, store, meta, "evaluation")


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
    local = Path(
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=MODEL_DIR, dst_path=str(dst), tracking_uri=uri)
    )
    info = json.loads((local / "model.json").read_text())
    return local / info["file"], info
