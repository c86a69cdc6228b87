"""What a rank keeps in host memory while its GPU computes: under ``--nn-device stream`` its rows and their
activations (ntp.engine.parallel.row_stream), and under ``--offload all`` the column slice. What bench/plan.py adds up
per machine; ntp.engine.memory.parts counts what stays on the device."""

from __future__ import annotations

from ntp.engine.device.precision import element_bytes
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.parts import (
    classic_width,
    inner_width,
    input_dropped_in_product,
    nn_stage_bytes,
    rank_slice_width,
    working_copies,
)

#: copies of the column slice that host memory holds under ``--offload all``: the product's input and its output,
#: then, in the backward, the gradient and the one it makes (products keep nothing; the chunks' scaled float32 copies
#: are the device's; tests/ntp/test_memory_estimate.py measures a streamed step)
STREAMED_SLICE_COPIES = 2


def stream_host_bytes(
    cfg,  # noqa: ANN001 (a TrainConfig)
    *,
    num_nodes: int,
    feature_dim: int,
    out_dim: int,
    world: int,
) -> int:
    """Host memory of a rank whose NN stage streams (``--nn-device stream``; ``cfg``: a TrainConfig) besides the
    topology: its rows (:func:`nn_stage_bytes`, the features among them; the input's dropout runs on a block on the
    device, and a model's last segment computes the loss block by block, ntp.engine.nn.models.GraphModel.forward,
    so neither a dropped copy nor a float32 copy of the output is in host memory), and, under ``--offload all``, the
    column slice's embeddings (:data:`STREAMED_SLICE_COPIES`; as where the device cannot hold them: bench/plan.py
    plans a slice that fits as ``--offload topology``, ntp.engine.memory.offload.offloaded_layout). The parameters and their optimiser state stay on the device."""
    rows = ceil_div(num_nodes, world)
    rows_bytes = nn_stage_bytes(
        rows,
        feature_dim,
        cfg.hidden,
        out_dim,
        cfg.nn_layers,
        0,
        cfg.precision,
        "cuda",
        0.0,  # the input's dropped copy is a block's, on the device
        inner_width(cfg),
        input_dropped_in_product(cfg),
        classic_width(cfg, out_dim),
        0,  # no float32 copies of the output: the loss is the last segment's
        working_copies(cfg),
    )
    slice_bytes = num_nodes * rank_slice_width(cfg, out_dim, world) * element_bytes(cfg.precision)
    return rows_bytes + (STREAMED_SLICE_COPIES * slice_bytes if cfg.offload == "all" else 0)
