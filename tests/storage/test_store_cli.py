"""`python -m storage.cli data prepare|info`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from store_helpers import REPO

from storage.cli import add_data_commands, main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "storage.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_prepare_then_info(tmp_path):
    res = run_cli(
        "data",
        "prepare",
        "synthetic",
        "--nodes",
        "400",
        "--features",
        "4",
        "--classes",
        "3",
        "--data-dir",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    path = res.stdout.strip().splitlines()[-1]
    assert path.startswith(str(tmp_path / "stores" / "synthetic-"))
    assert "pass 1" in res.stderr  # progress on stderr
    info = run_cli("data", "info", path, "--json")
    assert info.returncode == 0, info.stderr
    meta = json.loads(info.stdout)
    assert (meta["num_nodes"], meta["num_edges"], meta["feature_dim"], meta["num_classes"]) == (400, 4000, 4, 3)
    assert meta["schema_version"] == 1 and len(meta["fingerprint"]) == 16
    text = run_cli("data", "info", path, "--verify")
    assert text.returncode == 0 and "num_edges" in text.stdout


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["data", "info", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such store directory" in err and "Traceback" not in err
    assert main(["data", "prepare", "no-such-dataset", "--data-dir", str(tmp_path)]) == 2
    assert "--from-dir" in capsys.readouterr().err
    assert main(["data", "prepare", "synthetic", "--out", "s3://bucket/store"]) == 2
    assert "build it with --out FOLDER, then upload the folder" in capsys.readouterr().err
    assert not (tmp_path / "s3:").exists() and not os.path.exists("s3:"), "no local folder named like the URL"


def test_registers_on_a_foreign_parser(capsys):
    parser = argparse.ArgumentParser(prog="ntp")
    add_data_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "prepare", "synthetic", "--nodes", "10", "--symmetrize"])
    assert args.func.__name__ == "_run_prepare" and args.symmetrize and args.nodes == 10
    args = parser.parse_args(["data", "info", "x", "--json"])
    assert args.json and args.store == "x"
