"""Link prediction's memory plan: what a rank holds besides one chunk of propagation, so that ``--memory-budget``
bounds a link step as it bounds a node classifier's. The encoder counts as any model does (ntp.engine.memory.placement: its
NN stage where it runs on the rank's device, with the learned embeddings' rows as its input where the graph has no
features, and its column slice). The link step's parts stay on the rank's device wherever the encoder runs.

A link step holds besides (ntp.engine.tasks.link.task, ntp.engine.tasks.link.pairs): the learned node embeddings of a graph without
features, with their gradient and Adam's moments (this rank's columns; on a CPU rank also the whole matrices that
the state dicts gather from several ranks, in host memory), the gradient of the encoder's output that the pairs'
backward accumulates (and, where ``--offload all`` streams the slice through the device, the slice itself, which
the decoder reads whole there), one chunk of pairs in the decoder, and the batch's pairs. A CPU rank also holds, in
its own memory, the training edges with the epoch's order of them, the sorted keys of the graph's edges that
negative sampling avoids, and the evaluation splits' pairs. tests/ntp/test_link_memory.py counts a step's live
tensor bytes against it.
"""

from __future__ import annotations

import math

from ntp.config import TrainConfig
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.parts import PARAMETER_COPIES, attention_parts, rank_resident_parts
from ntp.engine.tasks.link.pairs import pair_chunk

#: Floats per pair and column of the rank's slice that a chunk holds through the decoder: the two ends' embeddings
#: and their product; then its gradient and one end's gradient on its way into the encoder's (or the decoder's own).
PAIR_COPIES, PAIR_GRADIENT_COPIES = 3, 2
#: Floats per pair of this rank's share and hidden column in the MLP decoder: the products' gathered rows (and,
#: over several ranks, the all-to-all's buffers and its backward's), and per hidden layer an activation and its
#: gradient (measured on a CPU: 1.3 a hidden layer, and 3 more over two ranks).
GATHERED_COPIES, GATHER_COPIES, LAYER_COPIES = 1, 3, 2
#: Bytes per pair of a chunk besides its embeddings: its ends' indices, score, loss terms and their gradients.
PAIR_BYTES = 64
#: Bytes per positive training edge of a step's pairs: it and its negative, two int64 ends each.
BATCH_PAIR_BYTES = 2 * 2 * 8
#: Host bytes per training edge on a CPU rank: its two int64 ends, and its place in the epoch's order.
TRAIN_EDGE_BYTES = 2 * 8 + 8
#: Host bytes per node id of the evaluation splits' pairs on a CPU rank (int64).
ID_BYTES = 8
#: Host bytes per edge of the message-passing graph on a CPU rank: its sorted int64 key, which negatives avoid.
KEY_BYTES = 8
#: float32 copies of the encoder's output its consumer holds besides its gradient ("output gradient"): the output
ENCODER_OUTPUT_COPIES = 1
#: float32 bytes: the learned embeddings, the decoder and its pairs stay float32 under --precision bf16 (only the
#: encoder's parts, which ntp.engine.memory.placement counts, are in the run's precision: ntp.engine.tasks.link.task.graph_embeddings).
F32 = 4


def resident_parts(cfg: TrainConfig, **shape) -> dict[str, int]:
    """What a link rank holds besides one chunk of propagation, by part (bytes): the encoder's and the link step's.
    ``shape``: ``num_nodes``, ``num_edges``, ``feature_dim`` (0: learned embeddings), ``splits`` (by split, the
    shapes of its positive pairs and of its negatives or None), ``world``, ``params`` (the encoder's and the
    decoder's), and optionally ``device_type``, ``symmetric``, ``nn_on_device`` and ``row_block`` (as
    ntp.engine.memory.parts.rank_resident_parts: the encoder's NN stage counts where it runs on the rank's device,
    or one block of it where it streams)."""
    encoder, step = _parts(cfg, **shape)
    return {**encoder, **step}


def reserved_parts(cfg: TrainConfig, **shape) -> dict[str, int]:
    """What the model keeps besides aggregation's parts (ntp.engine.parallel.context.GraphContext's ``reserved``): the
    encoder's NN stage (and GAT's pattern and edge tensors) and the link step's parts; ``shape``: as
    :func:`resident_parts`."""
    encoder, step = _parts(cfg, **shape)
    return {"NN stage": encoder["NN stage"], **attention_parts(cfg, shape["num_nodes"], shape["num_edges"]), **step}


def _parts(
    cfg: TrainConfig,
    *,
    num_nodes: int,
    num_edges: int,
    feature_dim: int,
    splits: dict,
    world: int,
    params: int,
    device_type: str = "cuda",
    symmetric: bool = False,
    nn_on_device: bool = True,
    row_block: int = 0,
) -> tuple[dict[str, int], dict[str, int]]:
    """The encoder's parts and the link step's own, by part (bytes)."""
    width, on_host = cfg.hidden, device_type == "cpu"
    encoder = rank_resident_parts(
        cfg,
        num_nodes=num_nodes,
        num_edges=num_edges,
        feature_dim=feature_dim or width,
        out_dim=width,
        world=world,
        params=params,
        nn_on_device=nn_on_device,
        device_type=device_type,
        symmetric=symmetric,
        row_block=row_block,
        output_copies=ENCODER_OUTPUT_COPIES,
    )
    slice_width = ceil_div(width, world)
    counted = nn_on_device and not row_block  # the encoder's NN stage counts whole on this rank's device
    if counted and not feature_dim and world == 1 and cfg.precision == "fp32":
        encoder["NN stage"] -= F32 * num_nodes * width  # its input is the learned matrix itself, counted below
    step = {}
    if not feature_dim:  # this rank's columns of the learned matrix, with their gradient and Adam's moments
        gathered = (1 + 2 * bool(cfg.checkpoint_dir)) * num_nodes * width if world > 1 and on_host else 0
        step["node embeddings"] = F32 * (PARAMETER_COPIES * num_nodes * slice_width + gathered)
    step["output gradient"] = F32 * num_nodes * slice_width
    if cfg.offload == "all" and device_type == "cuda" and world > 1:
        # where products may stream the slice, the decoder still reads it whole on the device
        step["decoder's slice"] = F32 * num_nodes * slice_width
    step["pair chunk"] = pair_chunk_bytes(cfg, world, slice_width, device_type)
    train_edges = splits["train"][0][0]
    step["pairs"] = BATCH_PAIR_BYTES * min(cfg.link_batch, train_edges)
    if on_host:  # the job's edges and evaluation pairs: on a GPU rank they stay in host memory
        held = sum(math.prod(shape) for name, pair in splits.items() if name != "train" for shape in pair if shape)
        step["edges"] = TRAIN_EDGE_BYTES * train_edges + KEY_BYTES * num_edges + ID_BYTES * held
    return encoder, step


def pair_chunk_bytes(cfg: TrainConfig, world: int, slice_width: int, device_type: str) -> int:
    """The decoder's working set on one chunk of pairs (ntp.engine.tasks.link.pairs.train_pairs)."""
    pairs = min(pair_chunk(device_type), 2 * cfg.link_batch)
    after = PAIR_GRADIENT_COPIES * pairs * slice_width
    if cfg.decoder == "mlp":
        copies = GATHERED_COPIES + GATHER_COPIES * (world > 1) + LAYER_COPIES * (cfg.decoder_layers - 1)
        after = max(after, copies * ceil_div(pairs, world) * cfg.hidden)
    return F32 * (PAIR_COPIES * pairs * slice_width + after) + PAIR_BYTES * pairs
