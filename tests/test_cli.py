"""The `ntp` command line a new user meets first: a parser built from light modules only, `--version`,
`ntp train --dry-run`, and real runs that leave no files behind and print no warning nobody can act on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
CORA = PROJECT.parent / "shared" / "datasets" / "ogb-layout" / "cora"
HEAVY = ("torch", "zarr", "mlflow", "pandas", "prefect", "matplotlib")


@pytest.fixture(scope="module")
def cora_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not CORA.is_dir():
        pytest.skip(f"shared test data not found at {CORA}")
    from storage import prepare

    return str(prepare("cora", from_dir=CORA, out=tmp_path_factory.mktemp("stores") / "cora", progress=lambda s: None))


def _heavy_after(code: str) -> list[str]:
    """The heavy top-level packages imported after running ``code`` in a fresh interpreter."""
    check = f"{code}\nimport sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=PROJECT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return eval(out.strip().splitlines()[-1])  # a printed list of names


def test_building_the_parser_imports_no_heavy_library() -> None:
    code = (
        "import ntp.config, ntp.spec, ntp.run.cli as c\n"
        "for command in (None, 'train', 'evaluate', 'compare', '--help'):\n"
        "    c.build_parser(command)"
    )
    assert _heavy_after(code) == []


def test_version_names_ntp_and_torch_without_importing_torch() -> None:
    from importlib.metadata import version

    code = (
        "import contextlib, io, ntp.run.cli as c\nout = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n    c.main(['--version'])\n"
        "assert out.getvalue().startswith('ntp '), out.getvalue()"
    )
    assert _heavy_after(code) == []
    out = subprocess.run(
        [sys.executable, "-m", "ntp.run.cli", "--version"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.startswith(f"ntp {version('ntp')} (torch {version('torch')}")


def test_train_dry_run_prints_the_launch_the_plan_and_the_command(
    cora_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ntp.run.cli import main

    results = tmp_path / "r.jsonl"
    from tests.ntp.graphs import store_budget

    argv = [
        "train",
        "--store",
        cora_store,
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--memory-budget",
        store_budget(cora_store),
        "--results",
        str(results),
        "--no-track",
        "--dry-run",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tp on 1 node(s) x 2 process(es), device cpu, backend gloo" in out
    assert "from --memory-budget" in out and "chunk(s)" in out
    assert "-m ntp.run.rendezvous --nproc-per-node=2" in out and f"--results {results}" in out
    assert "--rdzv-endpoint=127.0.0.1:0" in out, "one node: a rendezvous on loopback"
    assert not results.exists() and not list(tmp_path.iterdir()), "a dry run writes nothing"
    assert main(["train", "--store", cora_store, "--mode", "single", "--dry-run", "--no-track"]) == 0
    assert "trains in this process" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--store", "/nonexistent/store"], "no such store"),
        (["--mode", "single", "--nproc", "2"], "--mode single runs one process"),
        (["--memory-budget", "1KB", "--nproc", "2", "--device", "cpu"], "cannot hold this rank: topology"),
    ],
)
def test_train_dry_run_refuses_bad_input_with_exit_2(
    cora_store: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ntp.run.cli import main

    store = [] if "--store" in argv else ["--store", cora_store]
    assert main(["train", *store, *argv, "--no-track", "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_a_budget_that_holds_a_gcn_run_is_refused_to_gat_for_its_edge_tensors(
    cora_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ntp.run.cli import main
    from tests.ntp.graphs import store_budget

    argv = [
        "train",
        "--store",
        cora_store,
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--memory-budget",
        store_budget(cora_store),
        "--no-track",
        "--dry-run",
    ]
    assert main(argv) == 0
    assert main([*argv, "--model", "gat"]) == 2
    err = capsys.readouterr().err
    assert "cannot hold this rank" in err and "attention" in err and "use fewer --heads" in err, err


def test_pipeline_dry_run_prints_the_parameters_and_runs_no_flow(capsys: pytest.CaptureFixture[str]) -> None:
    from ntp.run.cli import main

    assert main(["pipeline", "cora", "--nproc", "2", "--device", "cpu", "--epochs", "3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "params:" in out and "epochs: 3" in out and "launch: tp on 1 node(s) x 2 process(es)" in out


@pytest.mark.parametrize("fail", [False, True], ids=["trained", "failed"])
def test_training_leaves_no_files_and_no_warnings(cora_store: str, tmp_path: Path, fail: bool) -> None:
    tmpdir, cwd = tmp_path / "tmp", tmp_path / "cwd"
    tmpdir.mkdir()
    cwd.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        cora_store,
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--no-track",
        *(["--fail-rank", "1", "--fail-at-epoch", "1"] if fail else []),
    ]
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(PROJECT)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == (1 if fail else 0), proc.stderr
    assert sorted(os.listdir(tmpdir)) == [] and sorted(os.listdir(cwd)) == []
    if fail:
        assert "injected failure on rank 1" in proc.stderr
    else:
        assert proc.stderr == "" and "Warning" not in proc.stdout, proc.stderr
