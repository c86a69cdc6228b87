"""Champion and challenger, MLflow's alias convention: every fit registers a version under ``challenger``; the
``champion`` alias moves to it only if its validation metric beats the champion's (by ``margin``) on the same store
fingerprint. Versions carry the store fingerprint and their metrics as tags; the decision and both metrics are
logged to the challenger's training run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ntp.run.tracking.mlflow_store import client, tracking_uri

CHAMPION = "champion"
CHALLENGER = "challenger"
TAG_FINGERPRINT = "ntp.store_fingerprint"
TAG_VALID = "ntp.valid_metric"
TAG_TEST = "ntp.test_metric"
TAG_METRIC = "ntp.metric"


@dataclass
class Decision:
    name: str
    challenger_version: str
    promoted: bool
    reason: str
    challenger_valid: float | None
    champion_version: str | None = None
    champion_valid: float | None = None

    @property
    def champion_uri(self) -> str:
        return f"models:/{self.name}@{CHAMPION}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "champion_uri": self.champion_uri}


def register_challenger(
    model_uri: str,
    name: str,
    *,
    fingerprint: str,
    valid_metric: float | None,
    test_metric: float | None,
    metric: str = "",
    uri: str | None = None,
) -> str:
    """A new version of ``name`` from ``model_uri`` (a logged model), tagged with its store fingerprint and
    metrics, under the alias ``challenger``. Returns the version."""
    import mlflow

    mlflow.set_tracking_uri(uri or tracking_uri())
    c = client(uri)
    tags = _version_tags(fingerprint, valid_metric, test_metric, metric)
    version = str(mlflow.register_model(model_uri, name, tags=tags).version)
    c.set_registered_model_alias(name, CHALLENGER, version)
    return version


def tag_version(
    name: str,
    version: str,
    *,
    fingerprint: str,
    valid_metric: float | None,
    test_metric: float | None,
    metric: str = "",
    uri: str | None = None,
) -> None:
    """Tag an already registered version (``ntp train --register``) as :func:`register_challenger` does, and name it
    the challenger."""
    c = client(uri)
    for key, value in _version_tags(fingerprint, valid_metric, test_metric, metric).items():
        if value:
            c.set_model_version_tag(name, version, key, value)
    c.set_registered_model_alias(name, CHALLENGER, version)


def _version_tags(fingerprint: str, valid_metric: float | None, test_metric: float | None, metric: str) -> dict:
    """A challenger version's tags: its store's fingerprint, its metric's name and the metrics it has."""
    tags = {TAG_FINGERPRINT: fingerprint, TAG_METRIC: metric}
    for key, value in ((TAG_VALID, valid_metric), (TAG_TEST, test_metric)):
        if value is not None:
            tags[key] = repr(float(value))
    return tags


def _float(tags: dict[str, str], key: str) -> float | None:
    try:
        return float(tags[key])
    except (KeyError, ValueError):
        return None


def champion_version(name: str, uri: str | None = None) -> Any | None:
    """The version ``name@champion`` points to, None when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        return client(uri).get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def decide(
    name: str, version: str, *, margin: float = 0.0, run_id: str | None = None, uri: str | None = None
) -> Decision:
    """Move ``champion`` to ``version`` if it wins: no champion yet; or the champion was fitted on the same store
    fingerprint and the challenger's validation metric beats it by more than ``margin``. A champion from another
    store (the data changed) is not comparable by its recorded metric: the challenger, fitted on the current
    data, takes over. The decision and both metrics are logged to ``run_id`` (the challenger's run)."""
    c = client(uri)
    challenger = c.get_model_version(name, version)
    mine = _float(challenger.tags, TAG_VALID)
    fingerprint = challenger.tags.get(TAG_FINGERPRINT, "")
    current = champion_version(name, uri)
    if current is None:
        decision = Decision(name, version, True, "no champion yet", mine)
    else:
        theirs = _float(current.tags, TAG_VALID)
        same_store = current.tags.get(TAG_FINGERPRINT, "") == fingerprint and bool(fingerprint)
        if str(current.version) == str(version):
            decision = Decision(name, version, False, "already the champion", mine, str(current.version), theirs)
        elif not same_store:
            decision = Decision(
                name, version, True, "the champion was fitted on another store", mine, str(current.version), theirs
            )
        elif mine is None or (theirs is not None and mine <= theirs + margin):
            decision = Decision(
                name,
                version,
                False,
                f"valid {_fmt(mine)} does not beat the champion's {_fmt(theirs)} by more than {margin:g}",
                mine,
                str(current.version),
                theirs,
            )
        else:
            decision = Decision(
                name,
                version,
                True,
                f"valid {_fmt(mine)} beats the champion's {_fmt(theirs)} by more than {margin:g}",
                mine,
                str(current.version),
                theirs,
            )
    if decision.promoted:
        c.set_registered_model_alias(name, CHAMPION, version)
    if run_id:
        _log_decision(c, run_id, decision, margin)
    return decision


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def _log_decision(c: Any, run_id: str, d: Decision, margin: float) -> None:
    for key, value in (
        ("champion/challenger_valid", d.challenger_valid),
        ("champion/champion_valid", d.champion_valid),
    ):
        if value is not None:
            c.log_metric(run_id, key, value)
    c.set_tag(run_id, "ntp.champion.decision", "promoted" if d.promoted else "kept")
    c.set_tag(run_id, "ntp.champion.reason", d.reason)
    c.set_tag(run_id, "ntp.champion.model", f"{d.name}/{d.challenger_version}")
    if d.champion_version:
        c.set_tag(run_id, "ntp.champion.previous_version", d.champion_version)
    c.set_tag(run_id, "ntp.champion.margin", f"{margin:g}")
