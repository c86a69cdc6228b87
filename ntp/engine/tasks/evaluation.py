"""Metrics: accuracy for multi-class tasks, ROC-AUC for binary / multi-label ones (OGB's Evaluator for OGB data)."""

from __future__ import annotations

import sys

import numpy as np


def _ogb_evaluator_class(kind: str = "nodeproppred"):
    """Import OGB's Evaluator (``kind``: nodeproppred or linkproppred) without the thread that ogb starts at import
    to ask the network for a newer release (offline it can keep the process alive until the request times out)."""
    import importlib

    blocked = "ogb" not in sys.modules and "outdated" not in sys.modules
    if blocked:
        sys.modules["outdated"] = None  # type: ignore[assignment]  # ogb then skips its version check
    try:
        return importlib.import_module(f"ogb.{kind}").Evaluator
    finally:
        if blocked:
            del sys.modules["outdated"]


def compute_metric(metric: str, y_true: np.ndarray, y_pred: np.ndarray, ogb_name: str | None = None) -> float:
    """``y_pred``: class ids [k] for "acc"; scores [k, tasks] for "rocauc", or class probabilities [k, C] when
    ``y_true`` holds class ids (integers [k]): see :func:`class_scores`."""
    if len(y_true) == 0:
        return float("nan")
    if ogb_name is not None:
        return _ogb_metric(ogb_name, metric, y_true, y_pred)
    if metric == "acc":
        return float((y_true.reshape(-1) == y_pred.reshape(-1)).mean())
    if metric == "rocauc" and y_true.ndim == 1 and y_true.dtype.kind in "iu":
        y_true, y_pred = class_scores(y_true, y_pred)
    if metric == "rocauc":
        return _mean_rocauc(y_true.reshape(len(y_true), -1), y_pred.reshape(len(y_pred), -1))
    raise ValueError(f"unknown metric {metric!r}; expected 'acc' or 'rocauc'")


def class_scores(y: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROC-AUC's targets and scores of class ids ``y`` and class probabilities ``probs`` [k, C]: with two classes
    the positive class's column (one task, as Platonov et al. score tolokers), else one-vs-rest over the classes
    (one task each, averaged)."""
    probs = probs.reshape(len(y), -1)
    onehot = np.eye(probs.shape[1], dtype=np.float32)[y]
    return (onehot[:, 1:], probs[:, 1:]) if probs.shape[1] == 2 else (onehot, probs)


def _mean_rocauc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Mean ROC-AUC over tasks that have both classes among labeled vertices (OGB's definition)."""
    from sklearn.metrics import roc_auc_score

    aucs = []
    for t in range(y_true.shape[1]):
        labeled = ~np.isnan(y_true[:, t])
        yt = y_true[labeled, t]
        if (yt == 1).any() and (yt == 0).any():
            aucs.append(roc_auc_score(yt, scores[labeled, t]))
    if not aucs:
        return float("nan")
    return float(np.mean(aucs))


def _ogb_metric(ogb_name: str, metric: str, y_true: np.ndarray, y_pred: np.ndarray) -> float:
    evaluator = _ogb_evaluator_class()(ogb_name)
    key = evaluator.eval_metric
    y_pred = y_pred.reshape(len(y_pred), -1)
    return float(evaluator.eval({"y_true": y_true.reshape(len(y_true), -1), "y_pred": y_pred})[key])
