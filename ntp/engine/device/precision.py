"""Numeric precision of a run: ``fp32`` (the default, and the exactness reference) or ``bf16`` mixed precision.

bf16 keeps the features, the activations, what the collectives move and what aggregation reads in bfloat16 (half
the bytes), while parameters, optimiser state, losses and every sum stay float32: Linear layers run under
``torch.autocast``, sparse products accumulate in float32 (ntp.engine.graph.aggregate.csr_matmul), normalisation
statistics and softmaxes are taken in float32, and a model returns float32 outputs. On a GPU the dense products'
own sums stay float32 too (:func:`configure`).
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: Dtypes whose sums are accumulated in float32.
LOW_PRECISION = (torch.bfloat16, torch.float16)


def dtype(precision: str) -> torch.dtype:
    """The dtype of features and activations under ``precision``."""
    return DTYPES[precision]


def element_bytes(precision: str) -> int:
    """Bytes of one feature or activation element under ``precision`` (what the memory plan counts)."""
    return DTYPES[precision].itemsize


def autocast(precision: str, device: torch.device):
    """Where a model computes: its Linear layers in bfloat16 under ``bf16``, nothing changed under ``fp32``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def configure(precision: str, device: torch.device) -> None:
    """What a run's precision sets for its whole process: under bf16 on a GPU, cuBLAS sums every product in float32
    (torch lets it reduce split-K partial sums in bfloat16 by default; the weight gradients' products, long in the
    rows, are where it would). Nothing under fp32 or on a CPU."""
    if precision == "bf16" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def accumulation_dtype(dt: torch.dtype) -> torch.dtype:
    """The dtype sums of ``dt`` elements are taken in."""
    return torch.float32 if dt in LOW_PRECISION else dt
