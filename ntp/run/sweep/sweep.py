"""A whole sweep: the trials (ntp.run.sweep.study), the report in the parent run, the best model registered as the
challenger (and made the champion if it wins), the parent run ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ntp.run.sweep.report import SweepResult, log_report, logged_model_uri
from ntp.run.sweep.study import Sweep, SweepSettings, optimize
from ntp.run.tracking.mlflow_store import experiment_id


def run_sweep(settings: SweepSettings, *, margin: float = 0.0, on_line: Callable[[str], None] = print) -> SweepResult:
    """``ntp sweep``: the trials in this machine's processes, then :func:`finish_sweep`."""
    return finish_sweep(optimize(settings, on_line=on_line), margin=margin)


def finish_sweep(sweep: Sweep, *, margin: float = 0.0) -> SweepResult:
    """The report in the parent run, the best model registered (challenger; champion if it wins), the run ended."""
    c, run_id = sweep.client, sweep.parent_run_id
    try:
        result = log_report(sweep.study, run_id, c, warn=sweep.on_line)
        if sweep.settings.register and result.best_run_id:
            result.registered = register_best(result, sweep.settings, sweep.experiment, margin, c)
    except BaseException as exc:
        sweep.fail(exc)
        raise
    c.set_terminated(run_id, "FINISHED")
    return result


def register_best(
    result: SweepResult, settings: SweepSettings, experiment: str, margin: float, c: Any
) -> dict[str, Any] | None:
    """The best trial's logged model as a new version (alias ``challenger``), promoted to ``champion`` if it wins."""
    from ntp.run.tracking.champion import decide, register_challenger
    from storage import open_store

    model_uri = logged_model_uri(c, experiment_id(experiment, c), result.best_run_id)
    if model_uri is None:
        return None
    test = result.leaderboard.loc[0, "test_metric"] if not result.leaderboard.empty else None
    meta = open_store(settings.store).meta
    version = register_challenger(
        model_uri,
        settings.register,
        fingerprint=meta.fingerprint,
        valid_metric=result.best_value,
        test_metric=None if test is None else float(test),
        metric=meta.metric,
    )
    decision = decide(settings.register, version, margin=margin, run_id=result.parent_run_id)
    return {"name": settings.register, "version": version, "model_uri": model_uri, "decision": decision.to_dict()}
