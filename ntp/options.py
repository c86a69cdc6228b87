"""How options are written: the choices of each one (Literal types), sizes such as ``8GB``, YAML/TOML config files,
and the command-line flag of a field."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from ntp.errors import ConfigError

Model = Literal["gcn", "sgc", "appnp", "sage", "gin", "gat", "rgcn"]
Arch = Literal["decoupled", "coupled"]
Mode = Literal["single", "tp", "data"]
Optimizer = Literal["adam", "adamw"]
Norm = Literal["none", "batch", "layer"]
JumpingKnowledge = Literal["none", "last", "sum", "cat", "max"]
Offload = Literal["none", "topology", "all"]
NNDevice = Literal["auto", "device", "stream", "cpu"]
Decoder = Literal["mlp", "dot"]
Precision = Literal["fp32", "bf16"]
RelNorm = Literal["mean", "total", "sum"]
Decomposition = Literal["none", "basis", "block"]
Schedule = Literal["none", "cosine", "plateau"]
DecayLayers = Literal["all", "first"]
MetricName = Literal["acc", "rocauc"]
FitOn = Literal["train", "train+valid"]
Monitor = Literal["metric", "loss"]


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_bytes(text: str | int, flag: str = "--memory-budget") -> int:
    """``"8GB"``, ``"512MiB"``, ``"1.5g"`` or a plain byte count -> bytes; empty -> 0 (not given)."""
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if not str(text).strip():
            return 0
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"{flag} {text!r} is not a size; write a number with a unit, e.g. {flag} 8GB "
                f"(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            )
        value, unit = float(match.group(1)), match.group(2).lower()
    nbytes = int(value * _UNITS[unit])
    if nbytes <= 0:
        raise ConfigError(f"{flag} {text!r} must be positive, e.g. {flag} 8GB")
    return nbytes


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or TOML configuration file into a dict."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing .yaml/.toml file to --config")
    text = p.read_text()
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {p} is not valid {'TOML' if p.suffix == '.toml' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of option names to values")
    return data


#: Every Literal alias above by name: how a field annotated with one is checked.
_LITERALS = {name: value for name, value in dict(globals()).items() if get_origin(value) is Literal}


def literal_choices(type_name: str) -> tuple[str, ...]:
    """The choices of a field annotated with one of the Literal aliases above (``"Mode | None"`` included)."""
    literal = _LITERALS.get(type_name.removesuffix(" | None"))
    return tuple(get_args(literal)) if literal is not None else ()


def flag(name: str) -> str:
    """The command-line flag of a field: ``memory_budget`` -> ``memory-budget``."""
    return name.replace("_", "-")
