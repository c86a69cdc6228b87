"""Dependencies point one way: flows -> tasks -> ntp, storage. ntp and storage never import Prefect."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "ntp": {"prefect", "tasks", "flows"},
    "storage": {"prefect", "tasks", "flows", "ntp", "mlflow"},
    "tasks": {"flows"},
}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _imported_top_levels(path) & FORBIDDEN[package]
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{package}/ must not import {sorted(FORBIDDEN[package])}: {offenders}"
