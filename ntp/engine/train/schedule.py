"""Learning-rate schedules (--lr-schedule, --warmup-epochs), made of torch's own schedulers and stepped once per
epoch after the optimiser: a linear warm-up (LinearLR from lr/(N+1)) then cosine annealing (CosineAnnealingLR, to
--min-lr at the last epoch) or reduce-on-plateau (ReduceLROnPlateau on the validation metric). Every rank steps the
same schedule on the same (all-reduced) metric, so the learning rates agree on all ranks."""

from __future__ import annotations

import warnings

import torch
from torch.optim import lr_scheduler as S

from ntp.config import TrainConfig


class Schedule:
    """The epoch-wise schedule of one optimiser; ``step`` after each epoch's update."""

    def __init__(self, cfg: TrainConfig, optimizer: torch.optim.Optimizer) -> None:
        self.warmup, self.optimizer = cfg.warmup_epochs, optimizer
        self.plateau: S.ReduceLROnPlateau | None = None
        self.scheduler: S.LRScheduler | None = None
        warm = S.LinearLR(optimizer, 1.0 / (self.warmup + 1), 1.0, total_iters=self.warmup) if self.warmup else None
        if cfg.lr_schedule == "cosine":
            cosine = S.CosineAnnealingLR(optimizer, T_max=cfg.epochs - self.warmup, eta_min=cfg.min_lr)
            self.scheduler = S.SequentialLR(optimizer, [warm, cosine], [self.warmup]) if warm else cosine
        else:
            self.scheduler = warm
            if cfg.lr_schedule == "plateau":  # its constructor leaves the learning rate alone
                self.plateau = S.ReduceLROnPlateau(
                    optimizer,
                    mode="max",
                    factor=cfg.plateau_factor,
                    patience=cfg.plateau_patience,
                    min_lr=cfg.min_lr,
                )

    def step(self, epoch: int, valid_metric: float | None) -> None:
        """After epoch ``epoch``'s update: advance to the next epoch's learning rate."""
        if self.plateau is not None and epoch >= self.warmup:
            if valid_metric is not None:
                self.plateau.step(valid_metric)
        elif self.scheduler is not None:
            self.scheduler.step()

    def lr(self) -> float:
        """The learning rate of the epoch about to run (of the first parameter group)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the plateau's state and the rates reached (warm-up and cosine are replayed)."""
        return {
            "plateau": self.plateau.state_dict() if self.plateau is not None else None,
            "lrs": [float(g["lr"]) for g in self.optimizer.param_groups],
        }

    def resume(self, epochs_done: int, state: dict | None) -> None:
        """Go on after ``epochs_done`` epochs: warm-up and cosine are replayed for today's --epochs (which a resume
        may change), the plateau's counters and rates come from the checkpoint's ``state``."""
        with warnings.catch_warnings():  # replayed without optimiser steps, on purpose
            warnings.simplefilter("ignore", UserWarning)
            for epoch in range(epochs_done):
                if self.scheduler is not None and (self.plateau is None or epoch < self.warmup):
                    self.scheduler.step()
        if self.plateau is not None and state and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])
            for group, lr in zip(self.optimizer.param_groups, state["lrs"]):
                group["lr"] = lr


def describe(cfg: TrainConfig) -> str:
    """The resolved schedule in words (logged to MLflow as the ``lr_schedule_resolved`` param)."""
    parts = []
    if cfg.warmup_epochs:
        parts.append(f"LinearLR(start_factor=1/{cfg.warmup_epochs + 1}, total_iters={cfg.warmup_epochs})")
    if cfg.lr_schedule == "cosine":
        parts.append(f"CosineAnnealingLR(T_max={cfg.epochs - cfg.warmup_epochs}, eta_min={cfg.min_lr:g})")
    elif cfg.lr_schedule == "plateau":
        parts.append(
            f"ReduceLROnPlateau(mode=max on valid, factor={cfg.plateau_factor:g}, "
            f"patience={cfg.plateau_patience}, min_lr={cfg.min_lr:g})"
        )
    body = " then ".join(parts) if parts else "constant"
    return f"{body}; lr={cfg.lr:g}, {cfg.optimizer}, stepped per epoch"
