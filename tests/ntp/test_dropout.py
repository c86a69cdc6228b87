"""Dropout masks are a function of (stream, global row, column) alone: the same for every world size, in one
vectorised pass, with the right keep rate and no visible structure."""

from __future__ import annotations

import threading

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.distributed.partition import Partition
from ntp.engine.kernels import dropout, masks, native, packed
from ntp.engine.kernels.dropout import drop, dropped
from ntp.engine.kernels.masks import device_keep_mask, keep_mask, stream_keep_mask
from ntp.engine.kernels.packed import packed_bytes
from ntp.engine.train.setup import setup
from tests.ntp.graphs import loader, random_graph

CPU = torch.device("cpu")
SINGLE = DistEnv(0, 1, 0, 1, CPU, None)
GRAPH = random_graph(n=40, d=7, classes=3, seed=2)
GENERATORS = {
    "numpy (CPU)": lambda rows, w, p, s: stream_keep_mask(rows, w, p, s),
    "torch's ops (CUDA without its kernel; run here on CPU)": lambda rows, w, p, s: device_keep_mask(
        rows, w, p, s, CPU
    ),
}


#: drop rates whose CPU masks take 1, 8 and 16 bits per element
RATES = [0.5, 0.25, 0.4]


@pytest.mark.parametrize("gen", GENERATORS.values(), ids=GENERATORS.keys())
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("p", RATES)
def test_every_world_size_draws_the_same_mask(gen, world: int, p: float) -> None:
    n, width, stream = 1013, 37, 2**70 + 5  # sizes that divide nothing; a stream past 64 bits
    whole = gen((0, n), width, p, stream)
    parts = [gen(Partition(n, world, r).rows(), width, p, stream) for r in range(world)]
    assert torch.equal(torch.cat(parts), whole)


def test_the_cpu_mask_reads_splitmix64_words() -> None:
    """A stream's key is SplitMix64's first output from the stream, its word ``w`` SplitMix64's output at ``w + 1``
    from the key (computed here with Python's integers), and element ``e`` reads the ``bits`` bits from bit
    ``e * bits``, lowest first: the definition numpy's and the kernel's draws share, so a change of either shows here
    first."""

    def splitmix(state: int) -> int:
        z = state & (2**64 - 1)
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & (2**64 - 1)
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & (2**64 - 1)
        return z ^ (z >> 31)

    stream, rows, width = 2**70 + 5, (3, 40), 13
    key = splitmix(stream + 0x9E3779B97F4A7C15)
    assert masks.stream_key(stream) == key
    for p in RATES:
        bits, threshold = masks.field(p)
        expected = [
            [
                (splitmix(key + (e * bits // 64 + 1) * 0x9E3779B97F4A7C15) >> (e * bits % 64)) % 2**bits >= threshold
                for e in range(r * width, (r + 1) * width)
            ]
            for r in range(*rows)
        ]
        assert stream_keep_mask(rows, width, p, stream).tolist() == expected, p


@pytest.mark.parametrize("p", RATES)
def test_torchs_ops_draw_the_mask_numpy_draws(p: float) -> None:
    """Where no kernel drops (a GPU without Triton), torch's ops draw the mask on the device: the same words and
    fields as numpy's, so a run's masks are the same on every device (wrapping int64 arithmetic, masked shifts)."""
    for rows, width, stream in (((0, 1013), 37, 2**70 + 5), ((13, 999), 11, 3), ((5, 6), 3, 9), ((7, 8), 1, 2**63 + 1)):
        assert torch.equal(device_keep_mask(rows, width, p, stream, CPU), stream_keep_mask(rows, width, p, stream))


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("p", RATES)
def test_the_cpu_mask_is_the_same_on_any_number_of_threads(monkeypatch, threads: int, p: float) -> None:
    """Large CPU masks are drawn in blocks, one per torch thread and each on a thread of its own: the cut must
    not show in the mask."""
    rows, width, stream = (13, 1013), 37, 99
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = stream_keep_mask(rows, width, p, stream)
        monkeypatch.setattr(masks, "_MASK_BLOCK", 1000)  # cut even this small mask: 37 000 elements
        torch.set_num_threads(threads)
        assert torch.equal(stream_keep_mask(rows, width, p, stream), one)
        drawn_by, draw = [], masks._stream_block
        monkeypatch.setattr(
            masks, "_stream_block", lambda *a: (drawn_by.append(threading.current_thread().name), draw(*a))
        )
        assert torch.equal(stream_keep_mask(rows, width, p, stream), one)
        assert len(set(drawn_by)) == len(drawn_by) == threads, f"blocks not drawn at once: {drawn_by}"
        assert torch.equal(stream_keep_mask((13, 14), width, p, stream), one[:1]), "fewer rows than threads"
    finally:
        torch.set_num_threads(before)


def _saved(fn):
    """``fn()``'s result, and the (dtype, bytes) of each tensor autograd keeps for its backward."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.nbytes)) or t, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("redrawn", [False, True])
def test_dropped_zeroes_and_scales_with_the_gradient_masked(redrawn: bool) -> None:
    """...and keeps nothing for the backward where the mask can be drawn again (counter-based), else the mask
    packed, a bit an element (a boolean mask held 8x the bytes, a float copy 32x): the gradient is the plain ops'."""
    x = torch.randn(50, 9, requires_grad=True)
    draw = lambda: stream_keep_mask((0, 50), 9, 0.3, 4)  # noqa: E731
    keep = draw()
    y, saved = _saved(lambda: dropped(x, keep, 0.3, redraw=draw if redrawn else None))
    assert saved == ([] if redrawn else [(torch.uint8, packed_bytes(50 * 9))])
    assert torch.equal(y, torch.where(keep, x * (1 / 0.7), torch.zeros(())))
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, keep.float() * (1 / 0.7))


def test_relu_then_dropout_in_one_mask() -> None:
    """``dropped(x, keep, p, relu=True)`` is ``dropped(relu(x), keep, p)``, zeros included, forward and backward, and
    keeps the result's nonzero flags packed (a bit an element) where torch's ReLU kept its whole float output too;
    a ReLU of its own (ntp.engine.kernels.packed.relu) keeps its sign packed."""
    x = torch.randn(60, 11)
    x[::7, ::3] = 0.0  # ReLU's gradient at 0 is 0
    keep, grad = stream_keep_mask((0, 60), 11, 0.5, 8), torch.randn(60, 11)
    results, saved = [], {}
    for form, relu in (("fused", None), ("torch", torch.relu), ("packed", packed.relu)):
        leaf = x.clone().requires_grad_()
        fn = (lambda: dropped(leaf, keep, 0.5, relu=True)) if relu is None else (lambda: dropped(relu(leaf), keep, 0.5))
        y, saved[form] = _saved(fn)
        y.backward(grad)
        results.append((y.detach(), leaf.grad))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    bits = (torch.uint8, packed_bytes(60 * 11))
    assert saved == {"fused": [bits], "torch": [(torch.float32, 4 * 60 * 11), bits], "packed": [bits, bits]}


def test_the_one_pass_kernel_is_built_and_can_be_switched_off(monkeypatch) -> None:
    """``pip install`` builds the C kernel (CPU dropout in one pass); ``NTP_NATIVE=0`` takes torch's ops."""
    assert native.library() is not None, "ntp.engine.kernels._native is not built: pip install -e . builds it"
    monkeypatch.setenv("NTP_NATIVE", "0")
    native.library.cache_clear()
    try:
        assert native.library() is None
    finally:
        monkeypatch.undo()
        native.library.cache_clear()


#: (rows, columns, first row, first column, mask width): whole rows; a column slice of a wider mask (R-GCN's
#: column layout); rows that end inside a word of the stream; no rows
LAYOUTS = [(1013, 37, 17, 0, None), (333, 20, 0, 5, 41), (64, 64, 3, 0, None), (0, 5, 0, 0, None)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda la: "x".join(map(str, la[:2])) + f"@{la[2]},{la[3]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("p", RATES)
def test_the_one_pass_kernel_drops_what_the_mask_drawn_then_applied_drops(
    monkeypatch, layout, dtype, relu, p: float
) -> None:
    """The C kernel draws each keep flag from the same field of the stream :func:`stream_keep_mask` reads, so ``drop``
    equals ``dropped(x, keep_mask(...))``: values (NaN, infinities and -0 included) and gradients, for any cut of
    the rows among threads, strided rows, and a column slice of a wider mask; it keeps one boolean mask for the
    backward only after a ReLU, its nonzero flags packed (it draws the mask again otherwise), and writes no mask when
    no gradient is wanted."""
    n, w, row, col, width = layout
    stream = 2**70 + 5
    base = torch.randn(n, w + 3, dtype=dtype)  # x is its columns 1..w: rows strided
    if n:
        base[0, 1:4] = torch.tensor([float("nan"), -0.0, float("inf")])
    keep = keep_mask((row, row + n), width or w, p, stream, CPU)[:, col : col + w]
    grad = torch.randn(n, w, dtype=dtype)
    monkeypatch.setattr(masks, "_MASK_BLOCK", 500)  # rows cut among 3 threads, masks and kernel alike
    monkeypatch.setattr(dropout, "_KERNEL_PART", 500)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        results = []
        for one_pass in (True, False):
            leaf = base.clone().requires_grad_()
            x = leaf[:, 1 : w + 1]
            y, saved = _saved(
                lambda: (
                    drop(x, p, stream, row, relu, column=col, width=width) if one_pass else dropped(x, keep, p, relu)
                )
            )
            y.backward(grad)
            results.append((y.detach(), leaf.grad, saved))
        (y1, g1, saved), (y2, g2, _) = results
        torch.testing.assert_close(y1, y2, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(g1, g2, rtol=0, atol=0, equal_nan=True)
        assert saved == ([(torch.uint8, packed_bytes(n * w))] if relu else [])
        no_grad = drop(base[:, 1 : w + 1], p, stream, row, relu, column=col, width=width)  # no mask written
        torch.testing.assert_close(no_grad, y1, rtol=0, atol=0, equal_nan=True)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_world_size_drops_the_same_elements_in_one_pass(world: int) -> None:
    n, width, stream = 1013, 37, 77
    x = torch.randn(n, width)
    parts = [
        drop(x[slice(*Partition(n, world, r).rows())], 0.4, stream, Partition(n, world, r).rows()[0], True)
        for r in range(world)
    ]
    assert torch.equal(torch.cat(parts), drop(x, 0.4, stream, 0, True))


@pytest.mark.parametrize("hidden", [False, True], ids=["features", "hidden"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("p", RATES)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("strided", [False, True], ids=["rows", "column-slice"])
def test_the_dropout_runs_inside_the_product(
    monkeypatch, hidden: bool, bias: bool, p: float, threads: int, strided: bool
) -> None:
    """``RowDropout.linear`` is ``linear(dropout(x))`` block by block of rows, for the features (no gradient) and for
    a hidden layer (ReLU in the mask, ``x``'s gradient too): the same values and gradients, and no dropped copy or
    mask kept: only ``x`` itself, the weight and the keep flags packed a bit an element are saved for the backward,
    which reads them (blocks and threads of an odd width cut them at whole bytes; a column slice's rows start
    anywhere in a byte)."""
    monkeypatch.setattr(dropout, "_BLOCK_BYTES", 300 * 37 * 4)  # 4 blocks, the last one short
    monkeypatch.setattr(dropout, "_FUSED_LEAST_BYTES", 0)
    monkeypatch.setattr(dropout, "_KERNEL_PART", 1000)
    x, grad = torch.randn(1013, 40 if strided else 37)[:, :37], torch.randn(1013, 11)
    ctx = type("Ctx", (), {"seed": 3, "step": 5, "row_offset": 29})()
    layer = dropout.RowDropout(p, 0)
    results, saved, before = [], [], torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for fused in (True, False):
            torch.manual_seed(0)
            lin = torch.nn.Linear(37, 11, bias=bias)
            leaf = x.detach().requires_grad_(hidden)
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((fused, t)) or t, lambda t: t):
                if fused:
                    y = layer.linear(leaf, ctx, lin.weight, lin.bias, relu=hidden)
                    kept = [leaf, lin.weight]
                else:
                    y = lin(layer(leaf, ctx, relu=hidden))
            y.backward(grad)
            results.append(
                (
                    y.detach(),
                    lin.weight.grad,
                    lin.bias.grad if bias else torch.zeros(()),
                    leaf.grad if hidden else torch.zeros(()),
                )
            )
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):  # the weight's gradient sums the blocks in another order
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    if hidden:
        assert (results[0][3] == 0).float().mean() > p, "ReLU and the dropout both mask x's gradient"
    flags = [t for fused, t in saved if fused and all(t.data_ptr() != k.data_ptr() for k in kept)]
    assert len(flags) == 1 and flags[0].dtype == torch.uint8 and flags[0].numel() == (1013 * 37 + 7) // 8, (
        "no dropped copy or mask kept: the flags, a bit an element"
    )


@pytest.mark.parametrize("training", [True, False])
def test_the_input_layer_calls_its_linear_where_a_hook_waits_on_it(training: bool) -> None:
    """An embedding export hooks a decoupled model's Linears (ntp.engine.infer.predict): the first one is called, and its
    hook sees the layer's output, in training and in evaluation."""
    x = torch.randn(50, 9)
    ctx = type("Ctx", (), {"seed": 3, "step": 5, "row_offset": 0})()
    layer, lin, seen = dropout.RowDropout(0.5, 0).train(training), torch.nn.Linear(9, 4), []
    lin.register_forward_hook(lambda module, inputs, output: seen.append(output))
    y = layer.linear(x, ctx, lin.weight, lin.bias, module=lin)
    assert len(seen) == 1 and seen[0] is y


@pytest.mark.parametrize("gen", GENERATORS.values(), ids=GENERATORS.keys())
@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
def test_keep_rate_and_independence(gen, p: float) -> None:
    mask = gen((5_000, 25_000), 64, p, 11).float()
    assert abs(mask.mean().item() - (1 - p)) < 0.005
    assert (mask.mean(0) - (1 - p)).abs().max() < 0.03, "every column keeps at the same rate"
    assert (mask.mean(1) - (1 - p)).abs().mean() < 0.1, "every row keeps at about the same rate"
    other = gen((5_000, 25_000), 64, p, 12).float()
    agree = (mask == other).float().mean().item()
    assert abs(agree - ((1 - p) ** 2 + p**2)) < 0.005, "another stream (step, layer) is an independent mask"
    neighbours = (mask[:, 1:] == mask[:, :-1]).float().mean().item()
    assert abs(neighbours - ((1 - p) ** 2 + p**2)) < 0.005, "adjacent columns are independent"
    rows_agree = (mask[1:] == mask[:-1]).float().mean().item()
    assert abs(rows_agree - ((1 - p) ** 2 + p**2)) < 0.005, "adjacent rows are independent"


@pytest.mark.parametrize("arch, model", [("coupled", "sage"), ("decoupled", "gcn")])
def test_input_dropout_is_its_own_rate(arch: str, model: str) -> None:
    """One layer: its input is all that is dropped. With --input-dropout 0 training computes what evaluation does
    (PyG's and OGB's models drop only between layers); left out, the input's rate is --dropout's."""
    for input_dropout, drops in ((0.0, False), (None, True)):
        cfg = TrainConfig(
            model=model, arch=arch, nn_layers=1, hidden=8, dropout=0.5, input_dropout=input_dropout, mode="single"
        )
        job = setup(cfg, SINGLE, loader(GRAPH))
        train, evaluate = job.model.train()(job.x, job.ctx), job.model.eval()(job.x, job.ctx)
        assert torch.allclose(train, evaluate) != drops


@pytest.mark.parametrize("arch", ["coupled", "decoupled"])
def test_the_models_drop_inside_their_products(monkeypatch, arch: str) -> None:
    """A 2-layer GCN's dropouts (the features', and the hidden layer's with its ReLU) run inside the products after
    them where their input is large enough (no dropped copy; autograd keeps the keep flags packed); below the size
    they drop a copy. Either way no boolean mask is kept: the hidden one keeps its ReLU'd result's nonzero flags,
    packed, and a dropout without a ReLU keeps nothing (its mask is drawn again)."""
    cfg = TrainConfig(model="gcn", arch=arch, nn_layers=2, hidden=64, dropout=0.5, mode="single")
    job = setup(cfg, SINGLE, loader(GRAPH))
    fused, apply = [], dropout._DroppedLinear.apply
    monkeypatch.setattr(dropout._DroppedLinear, "apply", lambda *args: fused.append(1) or apply(*args))
    seen = {}
    for least in (0, 1 << 40):
        monkeypatch.setattr(dropout, "_FUSED_LEAST_BYTES", least)
        fused.clear()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
            job.model.train()(job.x, job.ctx).sum().backward()
        seen[least] = (len(fused) > 0, saved.count(torch.uint8) > 0, saved.count(torch.bool))
    assert seen == {0: (True, True, 0), 1 << 40: (False, True, 0)}


def test_no_two_purposes_layers_or_steps_share_a_stream_over_a_long_run() -> None:
    """A run of 20,000 steps: the encoder's dropout (4 layers), the link decoder's (3 layers), R-GCN's (3 layers of 4
    node types), the embeddings' tiles (8 tables) and the link sampling's epochs draw 20,000 * 19 + 10,000 distinct
    keys. The old products of primes failed here: at seed 0 the decoder's step 651 reused the encoder's layer 1 at
    step 20."""
    from types import SimpleNamespace

    from ntp.engine.kernels import streams
    from ntp.engine.tasks.hetero.rgcn import _dropout_stream

    seed, steps, types = 0, 20_000, ["a", "b", "c", "d"]
    encoder = [dropout.RowDropout(0.5, layer) for layer in range(4)]
    keys = []
    for step in range(steps):
        at = SimpleNamespace(seed=seed, step=step, row_offset=0, types=types)
        keys += [d._stream(at) for d in encoder]
        decoder = streams.stream(streams.Purpose.DECODER, seed, step)  # what the link task hands train_pairs
        keys += [streams.with_layer(decoder, layer) for layer in range(3)]
        keys += [_dropout_stream(at, t, layer) for layer in range(3) for t in types]
    keys += [streams.stream(streams.Purpose.EMBEDDING, seed, tile, table) for tile in range(1000) for table in range(8)]
    keys += [streams.stream(streams.Purpose.SAMPLING, seed, epoch) for epoch in range(2000)]
    keys = [masks.stream_key(k) for k in keys]
    assert len(set(keys)) == len(keys) == steps * 19 + 10_000
    with pytest.raises(ValueError, match="layer must be in"):
        streams.stream(streams.Purpose.ENCODER, seed, 0, layer=1 << 12)
