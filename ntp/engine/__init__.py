"""The training engine: everything that runs inside one rank. It imports no MLflow, Prefect, subprocess or argparse
(tests/test_architecture.py); ``distributed.collectives`` is its only module that communicates.

Packages, lowest first (each imports only from those before it):

- ``kernels``: dense products, dropout masks, C and Triton kernels
- ``device``: precision, pinned memory, host<->device copies, memory measurement
- ``distributed``: process groups, partitions, collectives and their traffic, the cost model
- ``graph``: topology, operators, sparse products, the door to the store
- ``memory``: chunk plans and where each stage runs under a budget
- ``parallel``: tensor/data parallel contexts, pipelining, the streamed NN stage
- ``nn``: models and layers
- ``tasks``: node classification, link prediction, heterogeneous R-GCN (no task imports another)
- ``train``: a rank's job, built and trained
- ``infer``: saved models applied (predictions, embeddings, scores, metrics)

The names below are the engine's public API; everything else is reachable by its module path.
"""

from ntp.engine.distributed.dist import DistEnv, distributed
from ntp.engine.infer.inference import evaluate_model, load_saved
from ntp.engine.infer.predict import Request, predict_in_process
from ntp.engine.nn.models import build_model
from ntp.engine.parallel.context import GraphContext
from ntp.engine.train.loop import evaluate_splits, fit, run, train_step
from ntp.engine.train.setup import Job, setup

__all__ = [
    "DistEnv",
    "GraphContext",
    "Job",
    "Request",
    "build_model",
    "distributed",
    "evaluate_model",
    "evaluate_splits",
    "fit",
    "load_saved",
    "predict_in_process",
    "run",
    "setup",
    "train_step",
]
