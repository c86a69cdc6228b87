"""What a rank holds, by part, in bytes: the NN stage's rows and activations, the topology, the column-slice
embeddings (resident, or streamed in column blocks under ``--offload all``), GAT's edge tensors, a streamed NN block.
What ``--memory-budget`` checks before any chunk; where each part goes is ntp.engine.memory.placement's decision.
tests/ntp/test_memory_estimate.py and the GPU tests compare these figures with measured peaks.
"""

from __future__ import annotations

from ntp.engine.device.precision import dtype, element_bytes
from ntp.engine.device.transfer import slab_columns, stream_depth
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.graph.aggregate import scales_rows
from ntp.engine.kernels.dropout import dropped_copy_bytes
from ntp.engine.kernels.packed import packed_bytes
from ntp.engine.memory.phases import segment_bytes

#: copies per activation element of a relational step (ntp.engine.tasks.hetero.memory): the activation, what backward
#: keeps, its gradient, and one temporary
ACTIVATION_COPIES = 4

#: activations as wide as the widest layer that a step holds at its peak besides what the backward keeps of the
#: layers before: a Linear's gradient and the gradient it makes (or, in the forward, a layer's input and output);
#: :func:`working_copies` adds the coupled layers' own (tests/ntp/test_memory_estimate.py traces the peaks)
WORKING_COPIES = 2

#: float32 copies per output element at the peak: the logits' gradient and the log-softmax's
OUTPUT_COPIES = 2

#: Device bytes per edge of each direction of the topology (ntp.engine.graph.topology: 32-bit indices, no values).
INDEX_BYTES = 4

#: Device bytes per vertex of each direction's row pointers (32-bit per chunk).
ROW_POINTER_BYTES = 4

#: Device bytes per vertex of an operator's three scaling vectors.
SCALING_BYTES = 3 * 4

#: copies per activation element of the coupled layers' classic options (ntp.engine.memory.parts.classic_width):
#: the value the backward keeps and its gradient (tests/ntp/test_memory_estimate.py: steps with them allocate 1.1 to
#: 2x less than so counted)
KEPT_COPIES = 2

#: fp32 copies per parameter: the weight, its gradient and Adam's two moments.
PARAMETER_COPIES = 4

#: float32 values per edge (self-loops included) that one head of one attention layer holds at its peak: the scores
#: gathered at both ends, the logits, the softmax's terms and its weights, and their gradients. Measured 5.4-7.2
#: (tests/ntp/test_memory_estimate.py counts a step's live tensor bytes).
ATTENTION_COPIES = 8

#: Device bytes per edge of the attention pattern (ntp.engine.graph.aggregate.EdgeWeightedTopology: sources,
#: transposed sources and their permutation, 32-bit); per vertex: two 32-bit row pointers and the softmax's int64
#: row offsets.
ATTENTION_INDEX_BYTES = 3 * 4
ATTENTION_VERTEX_BYTES = 2 * 4 + 8

#: the most device memory a streamed NN block takes (ntp.engine.parallel.row_stream): a larger one runs no faster, its
#: products being long already, and leaves less to aggregation's chunks
STREAM_BLOCK_BYTES = 1 << 30

#: the most rows of a streamed NN block (not measured): launches and a pass's collective are then a few percent of the
#: hundreds of MB it moves; more rows take room that a segment shares with what stays on the device (under
#: ``--offload all``, the topology where it stays; tests/ntp/test_stream_placement.py)
STREAM_BLOCK_ROWS = 1 << 17

#: the share of what the budget leaves beside a segment's other parts that a streamed NN block may take
STREAM_BLOCK_SHARE = 0.5

#: buffers of a pass of an exchange in passes as wide as the exchanged matrix's padded columns
#: (ntp.engine.distributed.collectives.Comm.split_pass): its send and receive buffers, and the previous pass's, which
#: the collective's thread may still hold for a moment (tests/ntp/test_communication.py holds an exchange to them)
EXCHANGE_COPIES = 4

#: the fewest rows of a streamed NN block: fewer, and each block's fixed costs (copies, kernel launches) dominate
MIN_STREAM_ROWS = 1024


def propagated_width(arch: str, hidden: int, out_dim: int) -> int:
    """The widest matrix propagation moves: the output (decoupled) or the widest layer (coupled)."""
    return out_dim if arch == "decoupled" else max(hidden, out_dim)


def rank_slice_width(cfg, out_dim: int, world: int) -> int:  # noqa: ANN001 (a TrainConfig)
    """Columns of a rank's slice of the widest propagated matrix, one at least (GraphContext.slice_width)."""
    return ceil_div(max(propagated_width(cfg.arch, cfg.hidden, out_dim), 1), world)


def nn_stage_bytes(
    rows: int,
    in_dim: int,
    hidden: int,
    out_dim: int,
    layers: int,
    params: int,
    precision: str = "fp32",
    device_type: str = "cuda",
    input_dropout: float = 0.5,
    inner: int = 0,
    in_product: bool = True,
    kept: int = 0,
    output_copies: int = OUTPUT_COPIES,
    working: int = WORKING_COPIES,
) -> int:
    """Memory of the NN stage on ``rows`` rows (the largest row block) on a ``device_type`` device: the input
    features and their dropped copy at rate ``input_dropout`` (no gradient flows into them;
    ntp.engine.kernels.dropout.dropped_copy_bytes: a block of it where their dropout runs inside the first product, which
    ``in_product`` allows: :func:`input_dropped_in_product`), what the backward keeps of each hidden activation
    but the widest layer's (and of ``inner`` columns more: :func:`inner_width`; :func:`kept_activation_bytes`), what
    the peak holds besides (:func:`in_flight_bytes`: ``working`` activations, ``output_copies`` of the output, as its
    consumer holds them), ``kept`` columns more that live with their gradient only (:func:`classic_width`), and the
    (float32) parameters with their gradients and Adam's moments. tests/ntp/test_memory_estimate.py counts a step's
    live tensor bytes against it."""
    eb = element_bytes(precision)
    dropped = (
        dropped_copy_bytes(device_type, dtype(precision), rows, in_dim, input_dropout)
        if in_product
        else eb * rows * in_dim
        if input_dropout
        else 0
    )
    features = eb * rows * in_dim + dropped
    in_flight = in_flight_bytes(rows, hidden, out_dim, layers, precision, inner, output_copies, working)
    # at the peak the backward has freed what it kept of the widest layer (it reads the layers' gradients there)
    kept_columns = max(hidden * (layers - 1) + inner - hidden, 0)
    activations = kept_activation_bytes(rows, kept_columns, precision) + in_flight
    return features + activations + eb * rows * kept * KEPT_COPIES + 4 * params * PARAMETER_COPIES


def in_flight_bytes(
    rows: int,
    hidden: int,
    out_dim: int,
    layers: int,
    precision: str = "fp32",
    inner: int = 0,
    output_copies: int = OUTPUT_COPIES,
    working: int = WORKING_COPIES,
) -> int:
    """What a step holds at its peak besides what the backward keeps, on ``rows`` rows: ``working`` activations of
    the widest layer (:func:`working_copies`), and ``output_copies`` float32 copies of the output."""
    widest = max(hidden if layers > 1 or inner else 0, out_dim)
    return rows * (element_bytes(precision) * widest * working + 4 * out_dim * output_copies)


def working_copies(cfg, device_type: str = "cuda") -> int:  # noqa: ANN001 (a TrainConfig)
    """:data:`WORKING_COPIES` for ``cfg``'s model on a ``device_type`` device. A coupled layer's peak is its
    propagation's backward: the gradient it reads and the one it makes (the product's output, counted among the
    graph's parts instead where a CPU multiplies in float32: :func:`float32_products`), then one more where two
    products read the layer's input (GraphSAGE's root term: the input is alive with both gradients) or the layer
    holds an MLP's hidden layer (GIN)."""
    if cfg.arch != "coupled":
        return WORKING_COPIES
    spec = cfg.model_spec
    return WORKING_COPIES - float32_products(device_type, cfg.precision) + (spec.root_term or spec.inner_mlp)


def float32_products(device_type: str, precision: str) -> bool:
    """Whether sparse products sum a copy of their input in float32 into a float32 output (a CPU's bfloat16 ones)."""
    return device_type == "cpu" and precision != "fp32"


def kept_activation_bytes(rows: int, columns: int, precision: str = "fp32") -> int:
    """What the backward keeps of ``columns`` hidden activation columns (each followed by a ReLU, maybe a dropout,
    and a product): the activation the product keeps, in the run's precision (bfloat16 under ``bf16``: autocast casts
    a product's inputs, and keeps the casts), and the ReLU's sign, or the ReLU'd dropout's nonzero flags, packed a bit
    an element (ntp.engine.kernels.packed; a dropout without a ReLU keeps nothing: its mask is drawn again)."""
    return rows * columns * element_bytes(precision) + packed_bytes(rows * columns)


def input_dropped_in_product(cfg) -> bool:
    """Whether the first layer's input dropout may run inside its product (ntp.engine.kernels.dropout.RowDropout.linear;
    ``cfg``: a TrainConfig): not in a coupled GraphSAGE, whose two products read the dropped input
    (ntp.engine.nn.models.SAGELayer), nor where the coupled layers' inputs are tensors of their own (``--residual``,
    ``--jk``) and no input projection drops the features inside its product."""
    coupled = cfg.arch == "coupled"
    materialized = coupled and (cfg.residual or cfg.jk != "none") and not cfg.input_proj
    return not (cfg.model_spec.root_term and coupled) and not materialized


def inner_width(cfg) -> int:
    """Activation columns of a layer besides its output, summed over the layers (``cfg``: a TrainConfig): a coupled
    GIN layer's MLP hidden layer, ``hidden`` wide."""
    return cfg.hidden * cfg.nn_layers if cfg.model_spec.inner_mlp and cfg.arch == "coupled" else 0


def classic_width(cfg, out_dim: int) -> int:  # noqa: ANN001 (a TrainConfig)
    """Activation columns the coupled layers' classic options add (ntp.engine.nn.models.CoupledGNN), summed over the
    layers: the input projection's output; each layer's residual sum (and its projection's output where the widths
    differ); each norm's output (its statistics, a few values a row or a column, are left out); with ``--jk``, a last
    layer ``hidden`` wide, the layers' outputs stacked (sum, max) or concatenated (cat), their combination (sum,
    max) and the head's output."""
    if cfg.arch != "coupled":
        return 0
    hidden, n, jk = cfg.hidden, cfg.nn_layers, cfg.jk != "none"
    last = hidden if jk else out_dim
    width = hidden if cfg.input_proj else 0
    if cfg.residual:
        width += hidden * (n - 1) + last + hidden * (not cfg.input_proj) + last * (last != hidden)
    if cfg.norm != "none":
        width += hidden * (n if jk else n - 1)
    if jk:
        width += hidden + hidden * n * (cfg.jk != "last") + hidden * (cfg.jk in ("sum", "max")) + out_dim
    return width


def graph_resident_parts(
    num_nodes: int,
    num_edges: int,
    slice_width: int,
    offload: str,
    precision: str = "fp32",
    device_type: str = "cuda",
    column_block: int = 1,
    topology_kept: bool = False,
    symmetric: bool = False,
    rows_counted: bool = False,
    rows_streamed: bool = False,
) -> dict[str, int]:
    """What aggregation keeps on the device besides one chunk: the topology (:func:`device_topology_bytes`) unless
    offloaded (or ``topology_kept`` there by ``--offload all``: ntp.engine.memory.offload.offloaded_layout), and the
    column-slice embeddings (input, output and their gradients; beside a streamed NN stage, ``rows_streamed``, a
    product's input and output or a segment's exchange's, as its backward keeps nothing in the graph layout; none where
    they are the NN stage's rows, counted there: ``rows_counted``, :func:`slice_is_rows`, which never streams), or, with
    ``offload == "all"`` on a GPU, the "column blocks" a product streaming ``column_block`` columns at a time holds
    (:func:`streamed_bytes`, alive only in the product; 0: the slice stays on the device; the default, one column, is
    the least before the plan has chosen). A product on the resident slice multiplies a float32 copy of its input where
    it makes one: a bfloat16 input's on a CPU, or rows scaled once (ntp.engine.graph.aggregate.scales_rows: on a GPU,
    float32 inputs; on a CPU, dense graphs), and a CPU's bfloat16 product writes a float32 output first."""
    eb = element_bytes(precision)
    streamed = offload == "all" and device_type == "cuda" and column_block > 0 and not rows_counted
    on_device = offload == "none" or topology_kept
    parts = {"topology": device_topology_bytes(num_nodes, num_edges, symmetric) if on_device else 0}
    if streamed:
        parts["column blocks"] = streamed_bytes(num_nodes, column_block, eb, stream_depth(not topology_kept))
    else:
        parts["embeddings"] = 0 if rows_counted else (2 if rows_streamed else 4) * num_nodes * slice_width * eb
    in_float32 = float32_products(device_type, precision)
    if not streamed and (in_float32 or scales_rows(num_edges, num_nodes * slice_width, device_type, precision)):
        parts["float32 product input"] = 4 * num_nodes * slice_width
    if not streamed and in_float32:
        parts["float32 product output"] = 4 * num_nodes * slice_width
    return parts


def slice_is_rows(world: int, nn_stage_bytes: int) -> bool:
    """Whether the column slice is the NN stage's rows themselves (one rank: split and gather are the identity), whose
    bytes the plan counts with the NN stage (``nn_stage_bytes`` on the rank's device), not again as embeddings
    (counted twice, a one-GPU plan was about twice a step: docs/benchmarks.md, section 8). ``--offload all`` keeps
    such a slice on the device and streams the topology, which holds less and is faster (an H100 at products scale:
    1.12x the in-device epoch at 4.24 GB, where streaming the slice took 3.83x at 5.02 GB)."""
    return world == 1 and nn_stage_bytes > 0


def device_topology_bytes(num_nodes: int, num_edges: int, symmetric: bool = False) -> int:
    """Device bytes of the topology kept there between products: both directions, or one where ``A`` is symmetric
    (``A^T`` is ``A``: ntp.engine.graph.topology), and the scaling vectors."""
    directions = 1 if symmetric else 2
    return directions * (num_edges * INDEX_BYTES + num_nodes * ROW_POINTER_BYTES) + num_nodes * SCALING_BYTES


def streamed_bytes(num_nodes: int, columns: int, element_bytes: int, depth: int = 1) -> int:
    """Device bytes of a product that streams ``columns`` columns at a time (ntp.engine.device.transfer.stream_columns):
    a block's input and output in each of ``depth`` sets (2 where the topology stays on the device: the next block
    arrives and the previous one leaves while one computes; ntp.engine.device.transfer.stream_depth), and a slab of columns
    (ntp.engine.device.transfer.slab_columns) on its way each way."""
    blocks = 2 * depth
    return num_nodes * element_bytes * (blocks * columns + 2 * min(columns, slab_columns(num_nodes, element_bytes)))


def attention_parts(cfg, num_nodes: int, num_edges: int) -> dict[str, int]:
    """What GAT (``cfg``: a TrainConfig) keeps on the rank's device per edge, self-loops included: its topology is
    its attention pattern, which replaces the row blocks the other models build (it propagates through nothing else,
    and offloads nothing), and its edge tensors, per head of every attention layer (coupled: each layer, one head in
    the last; decoupled: one attention whose weights every propagation step copies per head). Nothing for the other
    models."""
    if not cfg.model_spec.attention:
        return {}
    edges = num_edges + num_nodes
    if cfg.arch == "decoupled":
        floats = cfg.heads * (ATTENTION_COPIES + max(cfg.prop_steps - 1, 0))
    else:
        floats = ATTENTION_COPIES * (cfg.heads * (cfg.nn_layers - 1) + 1)
    topology = edges * ATTENTION_INDEX_BYTES + ATTENTION_VERTEX_BYTES * (num_nodes + 1)
    return {"topology": topology, "attention": 4 * edges * floats}


def rank_resident_parts(
    cfg,
    *,
    num_nodes: int,
    num_edges: int,
    feature_dim: int,
    out_dim: int,
    world: int,
    params: int,
    nn_on_device: bool,
    device_type: str = "cuda",
    symmetric: bool = False,
    row_block: int = 0,
    output_copies: int = OUTPUT_COPIES,
) -> dict[str, int]:
    """What stays in a rank's memory besides the aggregation chunks, by part: what ``--memory-budget`` must hold
    before any chunk (``cfg``: a TrainConfig; the NN stage counts where it runs on the rank's device, or, streamed in
    blocks of ``row_block`` rows, one block: "NN block"; ``symmetric``: ``A`` is, so one direction of the topology
    is kept; ``output_copies``: float32 copies of the output its consumer holds, :func:`in_flight_bytes`)."""
    rows = ceil_div(num_nodes, world)
    nn_bytes = (
        nn_stage_bytes(
            rows,
            feature_dim,
            cfg.hidden,
            out_dim,
            cfg.nn_layers,
            params,
            cfg.precision,
            device_type,
            cfg.first_dropout,
            inner_width(cfg),
            input_dropped_in_product(cfg),
            classic_width(cfg, out_dim),
            output_copies,
            working_copies(cfg, device_type),
        )
        if nn_on_device and not row_block
        else 0
    )
    parts = graph_resident_parts(
        num_nodes,
        num_edges,
        rank_slice_width(cfg, out_dim, world),
        cfg.offload,
        cfg.precision,
        device_type,
        symmetric=symmetric,
        rows_counted=slice_is_rows(world, nn_bytes),
        rows_streamed=row_block > 0,
    )
    parts.update(attention_parts(cfg, num_nodes, num_edges))  # GAT's topology replaces the row blocks'
    parts["NN stage"] = nn_bytes
    if row_block:  # the block lives only in the segments (ntp.engine.memory.phases), the parameters throughout
        parts["NN block"] = row_block * stream_row_bytes(cfg, feature_dim, out_dim, device_type, output_copies, world)
        parts["parameters"] = 4 * params * PARAMETER_COPIES
    return parts


def stream_row_bytes(
    cfg,  # noqa: ANN001 (a TrainConfig)
    in_dim: int,
    out_dim: int,
    device_type: str = "cuda",
    output_copies: int = OUTPUT_COPIES,
    world: int = 1,
) -> int:
    """Device bytes of one row of the NN stage streamed in row blocks (``cfg``: a TrainConfig;
    ntp.engine.parallel.row_stream): its activations in the backward's recompute (:func:`nn_stage_bytes` of one row, every
    layer counted, though a segment holds one or two), on a GPU the blocks on their way (on a CPU they are views of
    the rows): two of the input coming, two of the widest output leaving, and a row of an exchange's pass
    (:func:`exchange_row_bytes`: a segment next to propagation gathers its input and splits its output in its own
    passes)."""
    exchange = exchange_row_bytes(propagated_width(cfg.arch, cfg.hidden, out_dim), world, cfg.precision)
    per_row = nn_stage_bytes(
        1,
        in_dim,
        cfg.hidden,
        out_dim,
        cfg.nn_layers,
        0,
        cfg.precision,
        device_type,
        cfg.first_dropout,
        inner_width(cfg),
        input_dropped_in_product(cfg),
        classic_width(cfg, out_dim),
        output_copies,
        working_copies(cfg, device_type),
    )
    in_flight = 4 * element_bytes(cfg.precision) * max(in_dim, cfg.hidden, out_dim) if device_type == "cuda" else 0
    return per_row + in_flight + exchange


def exchange_row_bytes(width: int, world: int, precision: str = "fp32") -> int:
    """Device bytes per row of a pass of a ``width``-column matrix's exchange in passes on ``world`` ranks
    (:data:`EXCHANGE_COPIES` buffers of its padded columns); on one rank a pass is a copy of the block, which the
    segment holds already."""
    return EXCHANGE_COPIES * world * ceil_div(width, world) * element_bytes(precision) if world > 1 else 0


def stream_block_rows(row_bytes: int, rows: int, room: int) -> int:
    """Rows of a streamed NN block: as many as :data:`STREAM_BLOCK_SHARE` of ``room`` (what the budget leaves
    beside a segment's other parts; 0: unknown, as on a CPU rank) holds, up to :data:`STREAM_BLOCK_BYTES` and
    :data:`STREAM_BLOCK_ROWS`, and at least :data:`MIN_STREAM_ROWS` (a budget that cannot hold them fails in the
    plan, naming one that can)."""
    target = min(STREAM_BLOCK_BYTES, int(room * STREAM_BLOCK_SHARE)) if room > 0 else STREAM_BLOCK_BYTES
    fitting = min(STREAM_BLOCK_ROWS, target // max(1, row_bytes))
    return max(1, min(rows, max(MIN_STREAM_ROWS, fitting)))


def stream_parts(
    cfg,
    *,
    num_nodes: int,
    num_edges: int,
    feature_dim: int,
    out_dim: int,
    world: int,
    params: int,
    device_type: str,
    symmetric: bool,
    room: int,
) -> tuple[int, dict[str, int]]:
    """The rows of a streamed NN block, and a rank's resident parts (:func:`rank_resident_parts`) with its NN stage
    streamed in such blocks (``cfg``: a TrainConfig). The rows: ``--nn-block-rows``, or as many as
    :func:`stream_block_rows` gives from ``room`` (the budget, or the free device memory with its margin; 0: unknown)
    less what a segment holds beside the block (ntp.engine.memory.phases.segment_bytes). The preflight and the ranks
    plan with it alike."""
    shape = dict(
        num_nodes=num_nodes,
        num_edges=num_edges,
        feature_dim=feature_dim,
        out_dim=out_dim,
        world=world,
        params=params,
        device_type=device_type,
        symmetric=symmetric,
    )
    block = cfg.nn_block_rows
    if not block:  # a one-row block's parts: a row's bytes, and what a segment holds beside the block
        one_row = rank_resident_parts(cfg, nn_on_device=False, row_block=1, **shape)
        row_bytes = one_row["NN block"]
        left = room - segment_bytes(one_row) + row_bytes if room else 0
        block = stream_block_rows(row_bytes, ceil_div(num_nodes, world), max(left, 1) if room else 0)
    return block, rank_resident_parts(cfg, nn_on_device=False, row_block=block, **shape)
