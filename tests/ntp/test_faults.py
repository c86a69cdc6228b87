"""Faults of the reliability issue, each on real stores, checkpoints and files: resume checks, damaged checkpoints,
evaluation on another store, graphs with nothing to train on, output paths that cannot be written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.train import checkpoint
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError, ModelFileError
from ntp.run.cli import main as ntp_main
from ntp.run.preflight import check_launch
from ntp.spec import resolve

SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)


def _synthetic(root, seed: int) -> str:
    from storage import prepare

    return str(
        prepare(
            "synthetic",
            nodes=120,
            avg_degree=4.0,
            features=6,
            classes=3,
            seed=seed,
            out=root / f"synthetic-{seed}",
            progress=lambda s: None,
        )
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two stores with the same shapes (features, classes) but different content, hence fingerprints."""
    root = tmp_path_factory.mktemp("fault-stores")
    return _synthetic(root, 0), _synthetic(root, 1)


def _cfg(store: str, tmp_path, **kw) -> TrainConfig:
    base = dict(
        store=store, epochs=6, hidden=8, eval_every=2, checkpoint_every=2, checkpoint_dir=str(tmp_path / "ckpt")
    )
    return TrainConfig(**{**base, **kw})


def _train(cfg: TrainConfig):
    job = setup(cfg, SINGLE)
    return job, fit(job, sinks=[])


def _preflight(cfg: TrainConfig) -> None:
    check_launch(resolve(cfg, nproc=1, device="cpu"))


# -- 1. resume checks the checkpoint's config and store -------------------------------------------------------------
@pytest.mark.parametrize(
    "change, shown",
    [(dict(lr=0.05), "--lr 0.01 -> 0.05"), (dict(model="sage", dropout=0.2), "--model 'gcn' -> 'sage'")],
)
def test_resume_refuses_a_changed_option_before_and_inside_the_rank(stores, tmp_path, change, shown) -> None:
    _train(_cfg(stores[0], tmp_path, epochs=4))
    changed = _cfg(stores[0], tmp_path, epochs=8, resume=True, **change)
    for attempt in (lambda: _preflight(changed), lambda: _train(changed)):
        with pytest.raises(ConfigError) as err:
            attempt()
        assert shown in str(err.value) and "--resume-anyway" in str(err.value)
    if "dropout" in change:
        assert "--dropout 0.5 -> 0.2" in str(err.value)


def test_resume_allows_options_that_only_steer_the_run(stores, tmp_path) -> None:
    _train(_cfg(stores[0], tmp_path, epochs=4))
    steer = _cfg(
        stores[0],
        tmp_path,
        epochs=6,
        resume=True,
        eval_every=3,
        patience=5,
        threads=1,
        chunk_rows=50,
        checkpoint_every=3,
        collective_timeout_s=60,
        results=str(tmp_path / "r.jsonl"),
        model_out=str(tmp_path / "m.pt"),
    )
    _preflight(steer)
    job, _ = _train(steer)
    assert [r.epoch for r in job.history] == list(range(6))


def test_resume_refuses_another_store_unless_told(stores, tmp_path) -> None:
    a, b = stores
    _train(_cfg(a, tmp_path, epochs=4))
    other = _cfg(b, tmp_path, epochs=6, resume=True)
    for attempt in (lambda: _preflight(other), lambda: _train(other)):
        with pytest.raises(ConfigError, match="store fingerprint .* -> .*--resume-anyway"):
            attempt()
    job, _ = _train(other.replace(resume_anyway=True, lr=0.03))
    assert [r.epoch for r in job.history] == list(range(6))
    assert job.optimizer.param_groups[0]["lr"] == 0.03, "--resume-anyway continues with the new learning rate"


def test_resume_from_a_checkpoint_without_fingerprint_says_the_store_is_unknown(stores, tmp_path, capsys) -> None:
    _train(_cfg(stores[0], tmp_path, epochs=4))
    path = checkpoint.latest_checkpoint(tmp_path / "ckpt")
    state = checkpoint.load(path)
    state.pop("store_fingerprint")  # as written before checkpoints recorded the store
    torch.save(state, path)
    job, _ = _train(_cfg(stores[1], tmp_path, epochs=6, resume=True))
    assert len(job.history) == 6
    assert "no store fingerprint" in capsys.readouterr().out


# -- 2. a damaged latest checkpoint falls back to the previous one ---------------------------------------------------
def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_damaged_latest_checkpoint_is_skipped_for_the_previous_one(stores, tmp_path, capsys) -> None:
    _train(_cfg(stores[0], tmp_path, epochs=6))  # keeps ckpt-000003 and ckpt-000005
    _truncate(tmp_path / "ckpt" / "ckpt-000005.pt")
    cfg = _cfg(stores[0], tmp_path, epochs=8, resume=True, results=str(tmp_path / "r.jsonl"))
    _preflight(cfg)
    job, _ = _train(cfg)
    assert [r.epoch for r in job.history] == list(range(8))
    out = capsys.readouterr().out
    assert "ckpt-000005.pt" in out and "cannot be loaded" in out


def test_no_loadable_checkpoint_is_a_clear_error(stores, tmp_path) -> None:
    _train(_cfg(stores[0], tmp_path, epochs=6))
    for path in (tmp_path / "ckpt").glob("ckpt-*.pt"):
        _truncate(path)
    cfg = _cfg(stores[0], tmp_path, epochs=8, resume=True)
    for attempt in (lambda: _preflight(cfg), lambda: _train(cfg)):
        with pytest.raises(ConfigError, match="no checkpoint in .* can be loaded.*ckpt-000005.*ckpt-000003.*Delete"):
            attempt()


def test_a_new_run_is_refused_a_checkpoint_folder_holding_an_earlier_runs(stores, tmp_path) -> None:
    """Its checkpoints would be pruned in favour of the earlier run's later epochs, and --resume would pick those."""
    _train(_cfg(stores[0], tmp_path, epochs=4))  # keeps ckpt-000001 and ckpt-000003
    with pytest.raises(ConfigError, match=r"earlier run \(the latest: ckpt-000003.pt, 4 epochs done\).*--resume"):
        _preflight(_cfg(stores[0], tmp_path))
    _preflight(_cfg(stores[0], tmp_path, resume=True))  # continuing it is what the folder is for
    _preflight(_cfg(stores[0], tmp_path, checkpoint_dir=str(tmp_path / "new")))


# -- 3. evaluation checks the store fingerprint ----------------------------------------------------------------------
def test_evaluate_refuses_a_model_of_another_store(stores, tmp_path, capsys) -> None:
    from ntp.engine.infer.inference import evaluate_model

    a, b = stores
    model = tmp_path / "model.pt"
    _train(_cfg(a, tmp_path, epochs=2, checkpoint_dir=None, model_out=str(model)))
    fp_a = checkpoint.load(model)["store_fingerprint"]
    with pytest.raises(ModelFileError) as err:
        evaluate_model(model, b)
    assert fp_a in str(err.value) and "--any-store" in str(err.value)
    assert 0.0 <= evaluate_model(model, b, any_store=True)["test"] <= 1.0
    assert ntp_main(["evaluate", "--model", str(model), "--store", b]) == 2
    assert "--any-store" in capsys.readouterr().err
    assert ntp_main(["evaluate", "--model", str(model), "--store", b, "--any-store"]) == 0
    assert ntp_main(["evaluate", "--model", str(model), "--store", a]) == 0


# -- 4. nothing to train on ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unlabelled_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An edge list store without labels or splits."""
    from storage import prepare

    root = tmp_path_factory.mktemp("unlabelled")
    rng = np.random.default_rng(0)
    edges = root / "edges.csv"
    edges.write_text("src,dst\n" + "".join(f"{s},{d}\n" for s, d in rng.integers(0, 40, (160, 2))))
    return str(prepare("unlabelled", edges=edges, nodes=40, out=root / "store", progress=lambda s: None))


@pytest.mark.parametrize(
    "model, arch, mode",
    [
        ("gat", "decoupled", "single"),
        ("gat", "coupled", "single"),
        ("gat", "decoupled", "data"),
        ("gcn", "decoupled", "single"),
        ("sage", "coupled", "data"),
    ],
)
def test_graph_without_training_labels_is_refused_for_every_model(unlabelled_store, model, arch, mode) -> None:
    cfg = TrainConfig(store=unlabelled_store, model=model, arch=arch, mode=mode, epochs=1)
    for attempt in (lambda: _preflight(cfg), lambda: setup(cfg, SINGLE)):
        with pytest.raises(ConfigError, match="no labeled training vertex"):
            attempt()


# -- 5. output paths are checked before training --------------------------------------------------------------------
@pytest.mark.parametrize(
    "option, make, shown",
    [
        ("model_out", "dir", "is an existing directory"),
        ("model_out", "under_file", "is a file"),
        ("checkpoint_dir", "file", "is an existing file"),
        ("results", "dir", "is an existing directory"),
    ],
)
def test_unwritable_output_path_is_refused_before_training(stores, tmp_path, option, make, shown) -> None:
    target = tmp_path / "out"
    if make == "dir":
        target.mkdir()
    elif make == "file":
        target.write_text("x")
    else:
        (tmp_path / "blocker").write_text("x")
        target = tmp_path / "blocker" / "sub" / "model.pt"
    cfg = TrainConfig(store=stores[0], epochs=2, hidden=8, **{option: str(target)})
    flag = "--" + option.replace("_", "-")
    for attempt in (lambda: _preflight(cfg), lambda: setup(cfg, SINGLE)):
        with pytest.raises(ConfigError) as err:
            attempt()
        assert flag in str(err.value) and str(target) in str(err.value) and shown in str(err.value)
