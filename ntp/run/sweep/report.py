"""What a finished sweep shows in its MLflow parent run: the leaderboard table, the study's plots (optimisation
history, parallel coordinates, parameter importances), the best trial's parameters and metrics, and the best
trial's model registered."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ntp.run.sweep.study import ended_trials
from ntp.run.sweep.trial import INTERRUPTED_ATTR, RUN_ID_ATTR

PLOTS = {
    "optimization_history": "plot_optimization_history",
    "parallel_coordinate": "plot_parallel_coordinate",
    "param_importances": "plot_param_importances",
}


@dataclass
class SweepResult:
    study_name: str
    parent_run_id: str
    best_trial: int | None
    best_value: float | None
    best_params: dict[str, Any]
    best_run_id: str | None
    leaderboard: Any  #: a pandas DataFrame, best first
    counts: dict[str, int]  #: trials by state
    registered: dict[str, Any] | None = None  #: {"name", "version", "model_uri"} of the registered best model


def leaderboard(study: Any) -> Any:
    """One row per trial, best first: number, state, best validation metric, test metric, epochs, params, run."""
    import pandas as pd

    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append(
            {
                "trial": t.number,
                "state": "INTERRUPTED" if t.user_attrs.get(INTERRUPTED_ATTR) else t.state.name,
                "valid_metric": t.value,
                "test_metric": t.user_attrs.get("test_metric"),
                "epochs": None if t.last_step is None else t.last_step + 1,
                **{f"param.{k}": v for k, v in t.params.items()},
                "run_id": t.user_attrs.get(RUN_ID_ATTR),
            }
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    return table.sort_values(["valid_metric", "trial"], ascending=[False, True], na_position="last").reset_index(
        drop=True
    )


def log_report(study: Any, run_id: str, c: Any, warn: Callable[[str], None] = print) -> SweepResult:
    """Log the leaderboard, plots and best trial into the parent run; returns what the sweep found."""
    table = leaderboard(study)
    counts = table["state"].value_counts().to_dict() if not table.empty else {}
    c.log_table(run_id, data=table, artifact_file="tables/leaderboard.json")
    with tempfile.TemporaryDirectory() as tmp:
        table.to_csv(Path(tmp) / "leaderboard.csv", index=False)
        c.log_artifact(run_id, str(Path(tmp) / "leaderboard.csv"), "tables")
    _log_plots(study, run_id, c, warn)
    c.log_metric(run_id, "trials_complete", counts.get("COMPLETE", 0))
    c.log_metric(run_id, "trials_pruned", counts.get("PRUNED", 0))
    best = _best(study)
    if best is None:
        return SweepResult(study.study_name, run_id, None, None, {}, None, table, counts)
    for key, value in best.params.items():
        c.log_param(run_id, f"best.{key}", str(value))
    c.log_metric(run_id, "best_valid_metric", best.value, step=ended_trials(study))  # the curve's last point
    if best.user_attrs.get("test_metric") is not None:
        c.log_metric(run_id, "best_test_metric", best.user_attrs["test_metric"])
    best_run = best.user_attrs.get(RUN_ID_ATTR)
    c.set_tag(run_id, "ntp.sweep.best_trial", str(best.number))
    if best_run:
        c.set_tag(run_id, "ntp.sweep.best_run_id", best_run)
    return SweepResult(study.study_name, run_id, best.number, best.value, dict(best.params), best_run, table, counts)


def _best(study: Any) -> Any:
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return max(complete, key=lambda t: (t.value, -t.number)) if complete else None


def _log_plots(study: Any, run_id: str, c: Any, warn: Callable[[str], None]) -> None:
    """Optuna's matplotlib plots as PNGs under ``plots/`` (a plot the study cannot draw yet is skipped with a
    warning: importances need two complete trials)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")  # no display: the plots are files
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vm

    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                axes = getattr(vm, function)(study)
        except Exception as exc:
            warn(f"[sweep] no {name} plot: {type(exc).__name__}: {exc}")
            continue
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        figure.set_size_inches(10, 6)
        figure.tight_layout()
        c.log_figure(run_id, figure, f"plots/{name}.png")
        plt.close(figure)


def logged_model_uri(c: Any, experiment_id: str, run_id: str) -> str | None:
    """``models:/<model id>`` of the MLflow model a training run logged (None when it logged none)."""
    models = c.search_logged_models(experiment_ids=[experiment_id], filter_string=f"source_run_id = '{run_id}'")
    return f"models:/{models[0].model_id}" if models else None
