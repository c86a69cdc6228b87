"""Learning-rate schedules: the rates the loop trains with are torch's schedulers' (warm-up then cosine, as a
closed form; reduce-on-plateau, as a fresh ReduceLROnPlateau replaying the run's validation metrics), and a resumed
run goes on with the same rates."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError
from tests.ntp.graphs import loader, random_graph

SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
GRAPH = random_graph(n=80, d=9, classes=3, seed=7)


def _lrs(path) -> list[float]:
    return [r["lr"] for r in map(json.loads, open(path)) if "lr" in r]


def test_warmup_cosine_and_plateau_rates_are_torchs(tmp_path) -> None:
    base = dict(model="gcn", hidden=8, epochs=12, lr=0.02, seed=1)
    cfg = TrainConfig(**base, lr_schedule="cosine", warmup_epochs=3, min_lr=0.001, results=str(tmp_path / "c.jsonl"))
    fit(setup(cfg, SINGLE, loader(GRAPH)))
    w, t = 3, 12 - 3
    expected = [0.02 * (1 + e) / (w + 1) for e in range(w)]
    expected += [0.001 + (0.02 - 0.001) * (1 + math.cos(math.pi * e / t)) / 2 for e in range(t)]
    assert _lrs(tmp_path / "c.jsonl") == pytest.approx(expected, rel=1e-9)

    cfg = TrainConfig(
        **{**base, "epochs": 30, "lr": 0.05},
        lr_schedule="plateau",
        plateau_patience=1,
        plateau_factor=0.5,
        warmup_epochs=2,
        results=str(tmp_path / "p.jsonl"),
    )
    fit(setup(cfg, SINGLE, loader(GRAPH)))
    records = [r for r in map(json.loads, open(tmp_path / "p.jsonl")) if "lr" in r]
    opt = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.05)
    warm = torch.optim.lr_scheduler.LinearLR(opt, 1 / 3, 1.0, total_iters=2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=1)
    replayed = []
    for e, r in enumerate(records):
        replayed.append(opt.param_groups[0]["lr"])
        opt.step()  # no gradient, nothing moves: torch's schedulers expect a step before theirs, as in training
        warm.step() if e < 2 else plateau.step(r["valid_metric"])
    assert [r["lr"] for r in records] == pytest.approx(replayed, rel=1e-12)
    assert min(replayed) < 0.05, "the metric plateaued at least once in 30 epochs: the rate was cut"


@pytest.mark.parametrize("schedule", ["cosine", "plateau"])
def test_resumed_schedule_goes_on_with_the_rates_of_an_uninterrupted_run(schedule: str, tmp_path) -> None:
    """Interrupted after 5 of 5 epochs, resumed to 8 (--epochs may change on --resume): epochs 5-7 train with the
    rates of an 8-epoch run (cosine replayed for 8 epochs; the plateau's counters from the checkpoint)."""
    base = dict(model="gcn", hidden=8, lr=0.05, seed=2, lr_schedule=schedule, warmup_epochs=2, plateau_patience=0)
    fit(setup(TrainConfig(**base, epochs=8, results=str(tmp_path / "a.jsonl")), SINGLE, loader(GRAPH)))
    ckpt = str(tmp_path / "ckpt")
    fit(setup(TrainConfig(**base, epochs=5, checkpoint_every=5, checkpoint_dir=ckpt), SINGLE, loader(GRAPH)))
    resumed = TrainConfig(**base, epochs=8, checkpoint_dir=ckpt, resume=True, results=str(tmp_path / "b.jsonl"))
    fit(setup(resumed, SINGLE, loader(GRAPH)))
    whole, again = _lrs(tmp_path / "a.jsonl"), _lrs(tmp_path / "b.jsonl")
    assert again[5:] == pytest.approx(whole[5:], rel=1e-12)
    assert schedule == "plateau" or again[:5] != pytest.approx(whole[:5]), "the 5-epoch cosine was another one"


def test_schedule_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="--warmup-epochs"):
        TrainConfig(epochs=5, warmup_epochs=5)
    with pytest.raises(ConfigError, match="--min-lr"):
        TrainConfig(lr=0.01, min_lr=0.01)
    with pytest.raises(ConfigError, match="--eval-every 1"):
        TrainConfig(lr_schedule="plateau", eval_every=2)
