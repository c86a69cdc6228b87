"""ntp: tensor-parallel full-graph GNN training.

- Contracts shared by both sides: ``config`` (what to train), ``spec`` (how it is launched), ``records`` (what a
  run reports), ``errors`` (who must act).
- ``ntp.engine``: what runs inside a rank (collectives, kernels, models, the loop). No CLI, MLflow or Prefect.
- ``ntp.run``: the driver on the host (the ``ntp`` CLI, torchrun launch, MLflow tracking, compare).
"""
