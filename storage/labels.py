"""Validation of node labels, in one place for every source (OGB folders, edge lists, npz, synthetic).

Multiclass labels arrive as integers or floats (OGB's CSV and npz files hold floats); -1 and NaN
mean "unlabelled". A float with a fractional part, a value below -1 or a class id outside
[0, num_classes) is an error naming the vertex and the value, never silently truncated.
"""

from __future__ import annotations

import numpy as np

from storage.schema import StoreError

FIX = (
    "labels must be integer class ids in [0, C) with -1 (or NaN) for 'no label': correct the label "
    "file, or pass --classes C with the true number of classes"
)


def checked_labels(
    name: str, task_type: str, labels: np.ndarray, num_nodes: int, num_classes: int, num_tasks: int
) -> tuple[np.ndarray, int]:
    """(labels as stored, number of classes); num_classes 0 means 'infer it from the labels'."""
    y = np.asarray(labels)
    if task_type == "multiclass":
        return _multiclass(name, y, num_nodes, num_classes)
    if y.shape != (num_nodes, num_tasks) or y.dtype != np.float32:
        raise StoreError(
            f"{name}: {task_type} labels must be float32 [{num_nodes}, {num_tasks}], got "
            f"{y.dtype} {y.shape}. Fix: give one row of {num_tasks} values per vertex"
        )
    return y, num_classes or 2


def _problem(name: str, problem: str) -> StoreError:
    return StoreError(f"{name}: {problem}. Fix: {FIX}")


def _multiclass(name: str, y: np.ndarray, n: int, num_classes: int) -> tuple[np.ndarray, int]:
    if y.shape != (n,):
        raise _problem(name, f"multiclass labels must hold one value per vertex [{n}], got shape {y.shape}")
    if y.dtype.kind == "f":
        y = _integral(name, y)
    elif y.dtype.kind in "iub":
        if y.dtype.kind == "u" and y.size and int(y.max()) > n:
            y = y.astype(np.float64)  # a uint64 may not fit int64: the range check names it first
        else:
            y = y.astype(np.int64, copy=False)
    else:
        raise _problem(name, f"labels have dtype {y.dtype}, not numbers")
    return _in_range(name, y, n, num_classes)


def _integral(name: str, y: np.ndarray) -> np.ndarray:
    """Float labels as int64 (NaN -> -1); a fractional or infinite value is an error."""
    unlabelled = np.isnan(y)
    bad = ~unlabelled & (~np.isfinite(y) | (y != np.trunc(y)))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise _problem(
            name, f"vertex {row} has label {float(y[row])!r}, not an integer class id ({int(bad.sum())} such labels)"
        )
    return np.where(unlabelled, -1.0, y)  # still float: the range check runs before the cast


def _in_range(name: str, y: np.ndarray, n: int, num_classes: int) -> tuple[np.ndarray, int]:
    """Check every label against [-1, C) and return int64 labels with C."""
    if not y.size:
        return y.astype(np.int64), num_classes
    below = y < -1
    if below.any():
        row = int(np.flatnonzero(below)[0])
        raise _problem(name, f"vertex {row} has label {int(y[row])}; below -1 is not a class (use -1 for 'no label')")
    top = int(np.argmax(y))
    found = int(y[top]) + 1
    if num_classes and found > num_classes:
        raise _problem(
            name,
            f"vertex {top} has label {found - 1} but the dataset has {num_classes} classes (ids 0..{num_classes - 1})",
        )
    if not num_classes and found > n:
        raise _problem(
            name, f"vertex {top} has label {found - 1}, which would make {found:,} classes for only {n:,} vertices"
        )
    return y.astype(np.int64, copy=False), num_classes or found
