"""Champion and challenger: the freshly registered version is the challenger; the champion alias moves to it only
if it wins (ntp.run.tracking.champion), and then a Prefect event says so (the predict deployment's trigger)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

#: The event a champion move emits; resource ``mlflow.registered-model.<name>``.
CHAMPION_MOVED = "ntp.champion.moved"


@task(name="promote", cache_policy=NO_CACHE)
def promote_challenger(
    name: str,
    version: str,
    *,
    run_id: str,
    store: str,
    valid_metric: float | None,
    test_metric: float | None,
    margin: float = 0.0,
    predictions_out: str | None = None,
) -> dict[str, Any]:
    """Tag ``name`` ``version`` with its store fingerprint and metrics, alias it ``challenger``, and move
    ``champion`` to it if its validation metric beats the champion's on the same store by more than ``margin``. When
    the champion moves, emit :data:`CHAMPION_MOVED` with the champion's URI, the store and where predictions go."""
    from ntp.run.tracking.champion import decide, tag_version
    from storage import open_store

    logger = get_run_logger()
    meta = open_store(store).meta
    tag_version(
        name,
        version,
        fingerprint=meta.fingerprint,
        valid_metric=valid_metric,
        test_metric=test_metric,
        metric=meta.metric,
    )
    decision = decide(name, version, margin=margin, run_id=run_id)
    logger.info(
        "%s version %s %s: %s",
        name,
        version,
        "is the champion" if decision.promoted else "stays the challenger",
        decision.reason,
    )
    if decision.promoted:
        announce_champion(decision.to_dict(), store, predictions_out)
    return decision.to_dict()


def announce_champion(decision: dict[str, Any], store: str, predictions_out: str | None = None) -> None:
    """Emit :data:`CHAMPION_MOVED`: the champion's URI, the store and where its predictions go (what the predict
    deployment's trigger passes on)."""
    from prefect.events import emit_event

    name = decision["name"]
    emit_event(
        event=CHAMPION_MOVED,
        resource={"prefect.resource.id": f"mlflow.registered-model.{name}", "prefect.resource.name": name},
        payload={
            "model_uri": decision["champion_uri"],
            "version": decision["challenger_version"],
            "store": store,
            "predictions_out": predictions_out or default_predictions_out(name),
        },
    )


def default_predictions_out(name: str) -> str:
    """``<data dir>/predictions/<registered model>``: where the champion's predictions go unless told."""
    from ntp.run.tracking import data_dir

    return str(data_dir().resolve() / "predictions" / name)
