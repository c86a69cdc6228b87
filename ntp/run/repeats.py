"""``ntp train --splits all|LIST`` and ``--seeds N``: one training job per (split set, seed), one after the other,
and their mean +- standard deviation (sample std, ddof=1, as OGB's and Platonov et al.'s loggers report it). Tracked,
the jobs are children of one MLflow parent run that holds the summary (ntp.run.tracking.nested). ``--continue RUN``
takes up such a parent run that stopped (killed, failed, preempted): its finished children are kept, the others run."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ntp.config import CONTINUABLE_CHANGES, TrainConfig
from ntp.config_checks import parse_split_list
from ntp.errors import ConfigError, TrainingError
from ntp.run.scratch import owned_tempdir
from ntp.spec import LaunchSpec


def repeated(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` asks for several runs."""
    return bool(cfg.splits.strip()) or cfg.seeds > 0


def child_configs(cfg: TrainConfig, split_sets: int, parent_run: str | None = None) -> list[TrainConfig]:
    """One config per (split set, seed): split sets of --splits (else --split), seeds --seed .. --seed+N-1. Files
    the config names get a ``-splitK-seedS`` suffix, so the runs do not overwrite each other; checkpoints go to
    the folder ``splitK-seedS`` of --checkpoint-dir, or of its folder ``parent_run`` (the MLflow parent run's id),
    where a new parent never meets an earlier one's checkpoints and ``--continue`` finds its own."""
    chosen = parse_split_list(cfg.splits, split_sets) or [cfg.split]
    if chosen == [] or (cfg.splits.strip() and split_sets < 1):
        raise ConfigError(f"--splits {cfg.splits}: the store holds no split set")
    checkpoints = Path(cfg.checkpoint_dir, parent_run or "") if cfg.checkpoint_dir else None
    out = []
    for k in chosen:
        for seed in range(cfg.seed, cfg.seed + max(cfg.seeds, 1)):
            tag = f"split{k}-seed{seed}"
            out.append(
                cfg.replace(
                    split=k,
                    seed=seed,
                    splits="",
                    seeds=0,
                    results=_suffixed(cfg.results, tag),
                    model_out=_suffixed(cfg.model_out, tag),
                    checkpoint_dir=str(checkpoints / tag) if checkpoints else None,
                )
            )
    return out


def _suffixed(path: str | None, tag: str) -> str | None:
    if not path:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{tag}{p.suffix}"))


@dataclass
class RepeatSummary:
    metric: str
    tests: list[float]
    valids: list[float | None]  #: None: trained on train+valid, nothing held out
    run_ids: list[str | None]
    labels: list[str]

    @staticmethod
    def _mean_std(values: list[float]) -> tuple[float, float]:
        n = len(values)
        mean = sum(values) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
        return mean, std

    def add(self, label: str, test: float, valid: float | None, run_id: str | None) -> None:
        self.labels.append(label)
        self.tests.append(test)
        self.valids.append(valid)
        self.run_ids.append(run_id)

    def metrics(self) -> dict[str, float]:
        tm, ts = self._mean_std(self.tests)
        out = {"test_mean": tm, "test_std": ts, "runs": float(len(self.tests))}
        valids = [v for v in self.valids if v is not None]
        if valids:
            out["valid_mean"], out["valid_std"] = self._mean_std(valids)
        return out

    def latest(self) -> str:
        """The last run's test metric and the running mean, for a progress line after each run."""
        m = self.metrics()
        return (
            f"test {self.metric} {self.tests[-1]:.4f}; "
            f"mean of {len(self.tests)} so far {m['test_mean']:.4f} +- {m['test_std']:.4f}"
        )

    def lines(self) -> list[str]:
        out = [
            f"{label}: test {self.metric} {t:.4f}" + (f" (valid {v:.4f})" if v is not None else "")
            for label, t, v in zip(self.labels, self.tests, self.valids)
        ]
        m = self.metrics()
        valid = f" (valid {m['valid_mean']:.4f} +- {m['valid_std']:.4f})" if "valid_mean" in m else ""
        out.append(
            f"mean over {len(self.tests)} runs: test {self.metric} {m['test_mean']:.4f} +- {m['test_std']:.4f}{valid}"
        )
        return out


def train_repeats(
    spec: LaunchSpec,
    *,
    track: bool,
    experiment: str | None = None,
    run_name: str | None = None,
    on_line: Callable[[str], None] = print,
    continue_run: str | None = None,
) -> RepeatSummary:
    """Train every child of ``spec``'s config and summarise them (the parent run's metrics when ``track``). With
    ``continue_run``, the children go on under that stopped parent run; those that finished there are kept."""
    from contextlib import nullcontext

    from ntp.run.tracking import default_run_name, train_tracked, train_untracked
    from storage import open_store
    from storage.schema import split_sets

    meta = open_store(spec.config.store).meta
    sets = split_sets(meta.split_names)
    children = child_configs(spec.config, sets)
    base = run_name or default_run_name(spec)
    exp = experiment or meta.name
    summary = RepeatSummary(metric=spec.config.metric or meta.metric, tests=[], valids=[], run_ids=[], labels=[])
    params = {**spec.config.for_task(meta.task_type).to_dict(), "children": len(children)}
    kept: dict[tuple[int, int], tuple[float, float | None, str]] = {}
    if continue_run:
        if not track:
            raise ConfigError("--continue takes up a tracked run: drop --no-track")
        defaults = {key: spec.config.default_of(key) for key in params if key in TrainConfig.__dataclass_fields__}
        exp, base, kept = _continued(continue_run, params, defaults)
    if track:
        from ntp.run.tracking.nested import parent_run

        scope = parent_run(exp, kind="repeats", run_name=base, params=params, reopen=continue_run)
    else:
        scope = nullcontext()
    with scope as parent:
        if parent is not None:
            # with --continue, the job that was stopped resumes from its latest checkpoint (a fresh start if none)
            resume = spec.config.resume or bool(continue_run and spec.config.checkpoint_dir)
            children = child_configs(spec.config.replace(resume=resume), sets, parent.run_id)
        for i, cfg in enumerate(children):
            label = f"split {cfg.split}, seed {cfg.seed}"
            if (cfg.split, cfg.seed) in kept:
                test, valid, run_id = kept[cfg.split, cfg.seed]
                on_line(f"[ntp] run {i + 1}/{len(children)}: {label}: finished before (run {run_id}), kept")
                summary.add(label, test, valid, run_id)
                continue
            on_line(f"[ntp] run {i + 1}/{len(children)}: {label}")
            child = dataclasses.replace(spec, config=cfg)
            if parent is not None:
                tags = parent.child_tags(**{"ntp.split": cfg.split, "ntp.seed": cfg.seed})
                name = f"{base}-split{cfg.split}-seed{cfg.seed}"
                result = train_tracked(child, experiment=exp, run_name=name, on_line=on_line, tags=tags)
            else:  # the final record is read from the results file: one in a scratch folder unless --results
                with owned_tempdir("ntp-repeat-") as tmp:  # a killed launcher's is swept by the next
                    if not cfg.results:
                        child = dataclasses.replace(child, config=cfg.replace(results=str(Path(tmp) / "r.jsonl")))
                    result = train_untracked(child, on_line=on_line)
            final = result.final
            if final is None or final.test_metric is None:
                raise TrainingError(f"{label}: the job reported no test metric (no evaluation improved on the first)")
            summary.metric = final.metric
            summary.add(label, final.test_metric, final.best_valid_metric, result.run_id)
            on_line(f"[ntp] run {i + 1}/{len(children)}: {label}: {summary.latest()}")
        if parent is not None:
            parent.log_metrics(summary.metrics())
            parent.client.set_tag(parent.run_id, "ntp.metric", summary.metric)
    return summary


def _continued(
    run_id: str, params: dict, defaults: dict
) -> tuple[str, str, dict[tuple[int, int], tuple[float, float | None, str]]]:
    """The stopped --splits/--seeds parent run ``run_id``: its experiment's name, its name, and the (test, best
    valid, run id) of each (split set, seed) whose child finished. ConfigError where it is no such run, still runs,
    or was made with other options than ``params`` (all but :data:`CONTINUABLE_CHANGES` must be the same; an option
    newer than the run must be at its default, ``defaults``)."""
    from ntp.run.tracking import client
    from ntp.run.tracking.mlflow_store import TAG_KIND
    from ntp.run.tracking.orphans import close_orphaned_runs
    from ntp.run.tracking.runs import _param_value

    c = client()
    try:
        run = c.get_run(run_id)
    except Exception as exc:
        raise ConfigError(f"--continue {run_id}: no such MLflow run ({type(exc).__name__})") from None
    exp_id = run.info.experiment_id
    close_orphaned_runs(c, exp_id)  # a parent whose launcher died is ended now, and may go on
    if run.data.tags.get(TAG_KIND) != "repeats":
        raise ConfigError(f"--continue {run_id}: not the parent run of a --splits/--seeds run")
    if c.get_run(run_id).info.status == "RUNNING":
        raise ConfigError(f"--continue {run_id}: the run is still running; wait for it to end, or stop it")
    made = {key: run.data.params.get(key, _param_value(defaults.get(key))) for key in params}
    differ = [
        f"{key} {made[key]!r} there, {_param_value(value)!r} here"
        for key, value in params.items()
        if key not in CONTINUABLE_CHANGES and made[key] != _param_value(value)
    ]
    if differ:
        raise ConfigError(
            f"--continue {run_id}: that run was made with other options ({'; '.join(differ)}): "
            "give the same ones, or start a new run (drop --continue)"
        )
    return c.get_experiment(exp_id).name, run.info.run_name, _finished_children(c, exp_id, run_id)


def _finished_children(c, exp_id: str, run_id: str) -> dict[tuple[int, int], tuple[float, float | None, str]]:
    """(test, best valid, run id) of each (split set, seed) of which a child of ``run_id`` finished (the latest)."""
    from ntp.run.tracking.mlflow_store import TAG_PARENT

    kept = {}
    query = f"tags.{TAG_PARENT} = '{run_id}' and attributes.status = 'FINISHED'"
    for child in c.search_runs([exp_id], query, order_by=["attributes.start_time ASC"]):
        test = child.data.metrics.get("final_test_metric")
        if test is not None:
            key = (int(child.data.tags["ntp.split"]), int(child.data.tags["ntp.seed"]))
            kept[key] = (test, child.data.metrics.get("best_valid_metric"), child.info.run_id)
    return kept
