"""The search space of a sweep, from YAML: ranges and choices of any training option, plus the options every trial
shares.

```yaml
fixed:                 # every trial (any `ntp train` option; flags win over these)
  epochs: 30
space:
  lr: {low: 0.001, high: 0.1, log: true}   # a float range (log scale)
  hidden: [16, 32, 64]                     # choices
  dropout: {low: 0.0, high: 0.8}
  prop_steps: {low: 1, high: 4}            # both ends integers: an integer range
  model: [gcn, sgc]
```
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ntp.config import TrainConfig
from ntp.errors import ConfigError
from ntp.options import load_config_file

#: Options a sweep sets per trial itself; a space may not search them.
RESERVED = ("store", "results", "model_out", "resume")


@dataclass(frozen=True)
class Dimension:
    """One searched option: ``choices``, or a ``low``..``high`` range (integers when both ends are, ``log`` scale,
    an optional ``step``)."""

    name: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None

    @property
    def is_int(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    def suggest(self, trial: Any) -> Any:
        """The value of this option in an Optuna trial."""
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.name, self.low, self.high, step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def grid(self) -> list[Any]:
        """The values a grid search tries: the choices, or every step of an integer (or stepped) range."""
        if self.choices:
            return list(self.choices)
        if self.is_int or self.step:
            step = self.step or 1
            count = int(round((self.high - self.low) / step)) + 1
            return [type(self.low)(self.low + i * step) if self.is_int else self.low + i * step for i in range(count)]
        raise ConfigError(
            f"the grid sampler needs a finite set of values, but {self.name!r} is a float range: give it choices "
            f"(a list) or a step, or use --sampler tpe/random"
        )


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]
    fixed: dict[str, Any] = field(default_factory=dict)

    def suggest(self, trial: Any) -> dict[str, Any]:
        return {d.name: d.suggest(trial) for d in self.dimensions}

    def grid(self) -> dict[str, list[Any]]:
        return {d.name: d.grid() for d in self.dimensions}

    def as_dict(self) -> dict[str, Any]:
        """What a sweep logs: the space as it was read."""
        return {
            "fixed": dict(self.fixed),
            "space": {
                d.name: list(d.choices) if d.choices else {"low": d.low, "high": d.high, "log": d.log, "step": d.step}
                for d in self.dimensions
            },
        }


def load_space(path: str | Path) -> SearchSpace:
    """Read and check a search space file (ConfigError names the bad entry and the fix)."""
    data = load_config_file(path)
    return parse_space(data, source=str(path))


def parse_space(data: dict[str, Any], source: str = "the search space") -> SearchSpace:
    unknown = sorted(set(data) - {"space", "fixed"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {unknown}; a search space has `space:` and `fixed:`")
    entries = data.get("space") or {}
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(f"{source}: `space:` must map at least one training option to a range or a list of choices")
    fixed = {k.replace("-", "_"): v for k, v in (data.get("fixed") or {}).items()}
    dims = tuple(_dimension(name.replace("-", "_"), spec, source) for name, spec in entries.items())
    known = {f.name for f in fields(TrainConfig)}
    for name in [d.name for d in dims] + list(fixed):
        if name not in known:
            raise ConfigError(f"{source}: {name!r} is no training option; valid: {', '.join(sorted(known))}")
        if name in RESERVED:
            raise ConfigError(f"{source}: {name!r} is set by the sweep for each trial; remove it from the file")
    both = sorted({d.name for d in dims} & set(fixed))
    if both:
        raise ConfigError(f"{source}: {both} are both fixed and searched; keep each in one place")
    if fixed.get("fit_on", "train") != "train" or "fit_on" in {d.name for d in dims}:
        raise ConfigError(
            f"{source}: a sweep compares trials by their validation metric, which --fit-on train+valid leaves out: "
            "remove fit_on, and train the winner on train+valid afterwards"
        )
    for d in dims:  # every end of a range and every choice must make a valid config
        for value in d.choices or (d.low, d.high):
            try:
                TrainConfig.from_dict({**fixed, d.name: value})
            except (ConfigError, TypeError, ValueError) as exc:
                raise ConfigError(f"{source}: {d.name}={value!r} is not a valid training option: {exc}") from exc
    return SearchSpace(dims, fixed)


def _number(value: Any, name: str, source: str) -> float | int:
    if isinstance(value, bool):
        raise ConfigError(f"{source}: {name} must be a number, not {value!r}")
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)  # YAML reads 1e-3 as a string
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be a number, not {value!r}") from None


def _dimension(name: str, spec: Any, source: str) -> Dimension:
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{source}: {name} has an empty list of choices")
        return Dimension(name, choices=tuple(spec))
    if not isinstance(spec, dict) or not {"low", "high"} <= set(spec) or set(spec) - {"low", "high", "log", "step"}:
        raise ConfigError(
            f"{source}: {name} must be a list of choices or {{low: L, high: H}} (optional log: true, step: S), "
            f"not {spec!r}"
        )
    low, high = _number(spec["low"], f"{name}.low", source), _number(spec["high"], f"{name}.high", source)
    if not low < high:
        raise ConfigError(f"{source}: {name} needs low < high, got {low} and {high}")
    step = _number(spec["step"], f"{name}.step", source) if spec.get("step") is not None else None
    log = bool(spec.get("log", False))
    if log and low <= 0:
        raise ConfigError(f"{source}: {name} on a log scale needs low > 0, got {low}")
    return Dimension(name, low=low, high=high, log=log, step=step)
