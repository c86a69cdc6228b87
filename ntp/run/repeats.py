"""``ntp train --splits all|LIST`` and ``--seeds N``: one training job per (split set, seed), one after the other,
and their mean +- standard deviation (sample std, ddof=1, as OGB's and Platonov et al.'s loggers report it). Tracked,
the jobs are children of one MLflow parent run that holds the summary (ntp.run.tracking.nested)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ntp.config import TrainConfig
from ntp.config_checks import parse_split_list
from ntp.errors import ConfigError, TrainingError
from ntp.run.scratch import owned_tempdir
from ntp.spec import LaunchSpec


def repeated(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` asks for several runs."""
    return bool(cfg.splits.strip()) or cfg.seeds > 0


def child_configs(cfg: TrainConfig, split_sets: int) -> list[TrainConfig]:
    """One config per (split set, seed): split sets of --splits (else --split), seeds --seed .. --seed+N-1. Files
    the config names get a ``-splitK-seedS`` suffix, so the runs do not overwrite each other."""
    chosen = parse_split_list(cfg.splits, split_sets) or [cfg.split]
    if chosen == [] or (cfg.splits.strip() and split_sets < 1):
        raise ConfigError(f"--splits {cfg.splits}: the store holds no split set")
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
                    checkpoint_dir=str(Path(cfg.checkpoint_dir) / tag) if cfg.checkpoint_dir else None,
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

    def metrics(self) -> dict[str, float]:
        tm, ts = self._mean_std(self.tests)
        out = {"test_mean": tm, "test_std": ts, "runs": float(len(self.tests))}
        valids = [v for v in self.valids if v is not None]
        if valids:
            out["valid_mean"], out["valid_std"] = self._mean_std(valids)
        return out

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
) -> RepeatSummary:
    """Train every child of ``spec``'s config and summarise them (the parent run's metrics when ``track``)."""
    from contextlib import nullcontext

    from ntp.run.tracking import default_run_name, train_tracked, train_untracked
    from storage import open_store
    from storage.schema import split_sets

    meta = open_store(spec.config.store).meta
    children = child_configs(spec.config, split_sets(meta.split_names))
    base = run_name or default_run_name(spec)
    exp = experiment or meta.name
    summary = RepeatSummary(metric=spec.config.metric or meta.metric, tests=[], valids=[], run_ids=[], labels=[])
    if track:
        from ntp.run.tracking.nested import parent_run

        params = {**spec.config.for_task(meta.task_type).to_dict(), "children": len(children)}
        scope = parent_run(exp, kind="repeats", run_name=base, params=params)
    else:
        scope = nullcontext()
    with scope as parent:
        for i, cfg in enumerate(children):
            label = f"split {cfg.split}, seed {cfg.seed}"
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
            summary.tests.append(final.test_metric)
            summary.valids.append(final.best_valid_metric)
            summary.run_ids.append(result.run_id)
            summary.labels.append(label)
            summary.metric = final.metric
        if parent is not None:
            parent.log_metrics(summary.metrics())
            parent.client.set_tag(parent.run_id, "ntp.metric", summary.metric)
    return summary
