"""The evaluation report of a predictions export (`ntp predict` / `ntp evaluate --out`), computed from the exported
file: the metric per split, and for multi-class stores the per-class precision, recall and F1 and the confusion
matrix of the test split. Logged into an MLflow run as tables and a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ntp.engine.tasks.base import SPLITS
from ntp.engine.tasks.evaluation import compute_metric
from ntp.run.tracking.mlflow_store import client


def read_predictions(export: str | Path) -> Any:
    """The export as a DataFrame in node order."""
    import pandas as pd

    return pd.read_parquet(export).sort_values("node_id", ignore_index=True)


def evaluation_table(pred: Any, store: Any, metric: str | None = None, split_set: int = 0) -> Any:
    """One row per split of split set ``split_set``: nodes with a label, the metric (the model's ``metric``, else
    the store's) recomputed from the predictions."""
    import pandas as pd

    meta, labels = store.meta, store.labels()
    metric = metric or meta.metric
    ogb = meta.ogb_name if metric == meta.metric else None
    rows = []
    for split in SPLITS:
        ids = np.asarray(store.split(split, split_set), np.int64)
        y = labels[ids]
        labeled = y >= 0 if y.ndim == 1 else ~np.isnan(y).all(axis=1)
        ids, y = ids[labeled], y[labeled]
        scores = pred["pred"].to_numpy()[ids] if metric == "acc" else np.stack(pred["prob"].to_numpy()[ids])
        value = compute_metric(metric, y, scores, ogb) if len(ids) else float("nan")
        rows.append({"split": split, "metric": metric, "value": value, "nodes": len(ids)})
    return pd.DataFrame(rows)


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> np.ndarray:
    """[true class, predicted class] counts."""
    return np.bincount(y_true * classes + y_pred, minlength=classes * classes).reshape(classes, classes)


def per_class_table(matrix: np.ndarray) -> Any:
    """Precision, recall, F1 and support per class, from a confusion matrix (0 where undefined, as scikit-learn)."""
    import pandas as pd

    hits = np.diag(matrix).astype(float)
    predicted, support = matrix.sum(axis=0), matrix.sum(axis=1)
    precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
    recall = np.divide(hits, support, out=np.zeros_like(hits), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(hits), where=total > 0)
    return pd.DataFrame(
        {"class": np.arange(len(hits)), "precision": precision, "recall": recall, "f1": f1, "support": support}
    )


def confusion_figure(matrix: np.ndarray, title: str) -> Any:
    from matplotlib.figure import Figure

    classes = len(matrix)
    fig = Figure(figsize=(4 + 0.25 * classes, 3.5 + 0.25 * classes), dpi=100)
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax)
    if classes <= 20:
        for (i, j), count in np.ndenumerate(matrix):
            ax.text(
                j,
                i,
                str(count),
                ha="center",
                va="center",
                fontsize="small",
                color="white" if count > matrix.max() / 2 else "black",
            )
    ax.set(xlabel="predicted class", ylabel="true class", title=title)
    fig.tight_layout()
    return fig


def log_evaluation_report(
    run_id: str,
    export: str | Path,
    store_path: str | Path,
    uri: str | None = None,
    metric: str | None = None,
    split_set: int = 0,
) -> Any:
    """Log ``tables/evaluation.json`` and, for multi-class stores, ``tables/per_class_test.json`` and
    ``plots/confusion_test.png`` into ``run_id``. Returns the evaluation table."""
    from storage import open_store

    store = open_store(store_path)
    pred = read_predictions(export)
    c = client(uri)
    table = evaluation_table(pred, store, metric, split_set)
    c.log_table(run_id, data=table, artifact_file="tables/evaluation.json")
    if store.meta.task_type == "multiclass":
        test = np.asarray(store.split("test", split_set), np.int64)
        y = store.labels()[test]
        test, y = test[y >= 0], y[y >= 0]
        matrix = confusion_matrix(y, pred["pred"].to_numpy()[test], store.meta.num_classes)
        c.log_table(run_id, data=per_class_table(matrix), artifact_file="tables/per_class_test.json")
        c.log_figure(
            run_id, confusion_figure(matrix, f"Confusion matrix, test ({len(test)} nodes)"), "plots/confusion_test.png"
        )
    return table


def track_evaluation(
    run_id: str | None,
    metrics: dict,
    *,
    model_path: str | Path,
    store_path: str | Path,
    export: str | Path | None,
    experiment: str | None = None,
    register: str | None = None,
    uri: str | None = None,
) -> dict[str, Any]:
    """An evaluation in MLflow: the metrics into ``run_id`` (or a new evaluate run), the report of ``export``
    (None: a link model, no node predictions), and with ``register`` the model as a new version of that registered
    model. Returns {"run_id", and with register "model_uri", "version"}."""
    from ntp.engine.infer.inference import load_saved
    from ntp.run.tracking.mlflow_model import log_mlflow_model
    from ntp.run.tracking.runs import log_evaluation
    from storage import open_store

    run_id = log_evaluation(run_id, metrics, model_path=model_path, store=store_path, experiment=experiment, uri=uri)
    if export is not None:
        split_set = int(load_saved(model_path)["config"].get("split", 0))
        log_evaluation_report(run_id, export, store_path, uri, metrics.get("metric"), split_set)
    out: dict[str, Any] = {"run_id": run_id}
    if register:
        meta = open_store(store_path).meta.to_dict()
        logged = log_mlflow_model(
            run_id,
            model_path,
            store=store_path,
            store_meta=meta,
            config=load_saved(model_path)["config"],
            register=register,
            uri=uri,
            metrics={f"eval/{k}": v for k, v in metrics.items() if k in SPLITS},
        )
        out.update(model_uri=logged["model_uri"], version=logged["version"])
    return out
