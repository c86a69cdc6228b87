"""OGB node- and link-property metadata from the installed `ogb` package's master.csv files.

The file is read directly: importing `ogb` starts a thread that queries the package registry.
"""

from __future__ import annotations

import csv
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from storage.schema import StoreError

_TASK_TYPES = {"multiclass classification": "multiclass", "binary classification": "binary", "link prediction": "link"}


@dataclass(frozen=True)
class OgbInfo:
    """The master.csv column of one dataset."""

    name: str
    num_tasks: int
    num_classes: int
    metric: str
    task_type: str
    download_name: str
    version: int
    url: str
    add_inverse_edge: bool
    split: str
    is_hetero: bool
    binary: bool

    @property
    def zip_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def _master_csv(kind: str = "nodeproppred") -> Path:
    spec = importlib.util.find_spec("ogb")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise StoreError("the `ogb` package is not installed. Fix: pip install ogb==1.3.6")
    return Path(list(spec.submodule_search_locations)[0]) / kind / "master.csv"


@lru_cache(maxsize=1)
def ogb_table() -> dict[str, OgbInfo]:
    """All node- and link-property datasets OGB lists, by name (link prediction: task type "link")."""
    table = {}
    for kind in ("nodeproppred", "linkproppred"):
        with open(_master_csv(kind), newline="") as f:
            rows = list(csv.reader(f))
        names = rows[0][1:]
        fields = {row[0]: row[1:] for row in rows[1:]}
        for i, name in enumerate(names):
            col = {k: v[i] for k, v in fields.items()}
            table[name] = OgbInfo(
                name=name,
                num_tasks=int(col.get("num tasks", 1)),
                num_classes=int(col.get("num classes", 0)),
                metric=col["eval metric"],
                task_type=_TASK_TYPES.get(col["task type"], col["task type"]),
                download_name=col["download_name"],
                version=int(col["version"]),
                url=col["url"],
                add_inverse_edge=col["add_inverse_edge"] == "True",
                split=col["split"],
                is_hetero=col["is hetero"] == "True",
                binary=col["binary"] == "True",
            )
    return table


def ogb_info(name: str) -> OgbInfo | None:
    """OGB's metadata for `name`, or None if OGB does not list it."""
    return ogb_table().get(name)
