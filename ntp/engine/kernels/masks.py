"""Keep masks that are a function of (stream, global row, column) alone, so every world size drops the same
elements: the fields of a counter-based stream of words, the same on every device, drawn by vectorised passes
(numpy on a CPU, torch's ops elsewhere; the kernels draw the same words as they apply them: ``csrc/dropout.c`` on a
CPU, ntp.engine.kernels.cuda_dropout on CUDA). ntp.engine.kernels.dropout applies them."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import numpy as np
import torch

#: SplitMix64's increment and the multipliers of its finaliser's two steps (shifts 30, 27, then 31)
_GOLDEN, _MIX = 0x9E3779B97F4A7C15, ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB))


def stream_key(x: int) -> int:
    """The stream ``x``'s key (``x`` modulo 2^64): SplitMix64's first output from it. In Python's integers: every
    dropout call asks it, and a numpy call costs 17 us where this costs 0.5."""
    z = (x + _GOLDEN) % 2**64
    for shift, factor in _MIX:
        z = (z ^ (z >> shift)) * factor % 2**64
    return z ^ (z >> 31)


def keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Bernoulli(1-p) keep-mask for the global rows ``rows`` of a ``width``-wide matrix. Element ``(r, c)`` is a
    function of ``(stream, r, c)`` alone, so every world size (and every device) draws the same mask for the same
    element: a field of a counter-based stream at the element's index."""
    if device.type == "cpu":
        return stream_keep_mask(rows, width, p, stream)
    return device_keep_mask(rows, width, p, stream, device)


#: elements per thread below which one thread draws the whole mask (a thread hand-off costs more than it saves)
_MASK_BLOCK = 1 << 20


def stream_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int) -> torch.Tensor:
    """Element ``(r, c)`` keeps when its field of the stream of words keyed by ``stream`` (:func:`_stream_words`;
    the ``bits`` bits from bit ``(r * width + c) * bits``) is at least ``p * 2^bits`` (:func:`field`). Large masks
    are cut into up to one block per torch thread, drawn at once: the first here, the others by helper threads (a
    word is a function of its index: the mask does not depend on the cut)."""
    start, stop = rows
    bits, threshold = field(p)
    first, last = start * width, stop * width
    lo, hi = first - first % 8, -(-last // 8) * 8  # whole bytes of single bits: blocks start at multiples of 8
    flags = np.empty(hi - lo, dtype=bool)
    parts = thread_parts(hi - lo, _MASK_BLOCK)
    cuts = [lo + (hi - lo) * i // parts // 8 * 8 for i in range(parts)] + [hi]
    key = stream_key(stream)
    blocks = [(flags[a - lo : b - lo], a, b, key, bits, threshold) for a, b in zip(cuts, cuts[1:])]
    handed = [_helper(i).run(_stream_block, *block) for i, block in enumerate(blocks[1:])]
    _stream_block(*blocks[0])
    for done in handed:
        done.result()
    return torch.from_numpy(flags[first - lo : last - lo].reshape(stop - start, width))


def field(p: float) -> tuple[int, int]:
    """The bits of the stream one element's keep flag reads, and the least value that keeps: 1 bit for p = 0.5
    (the default: a sixteenth of the words of 16-bit fields), 8 when ``p * 256`` is whole, else 16 (exact to
    2^-16)."""
    bits = next((bits for bits in (1, 8) if (p * 2**bits).is_integer()), 16)
    return bits, min(int(p * 2**bits), 2**bits - 1)


def thread_parts(elements: int, least: int) -> int:
    """Into how many parts ``elements`` are cut: up to one per torch thread, each at least ``least`` elements."""
    return max(1, min(torch.get_num_threads(), elements // least))


class _Helper:
    """A thread that runs what it is handed, one call at a time. Each block of a mask goes to its own helper, so
    the blocks really run at once (a ThreadPoolExecutor hands a task to any idle thread: in an epoch one of its
    threads drew every block)."""

    def __init__(self, name: str) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def run(self, fn, *args) -> Future:
        done: Future = Future()
        self._inbox.put((fn, args, done))
        return done

    def _serve(self) -> None:
        while True:
            fn, args, done = self._inbox.get()
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # handed to the caller by done.result()
                done.set_exception(e)


_helpers: list[_Helper] = []


def _helper(i: int) -> _Helper:
    while len(_helpers) <= i:
        _helpers.append(_Helper(f"ntp-dropout-{len(_helpers)}"))
    return _helpers[i]


def _stream_block(out: np.ndarray, first: int, last: int, key: int, bits: int, threshold: int) -> None:
    """The keep flags of elements ``first:last`` (multiples of 8) into ``out`` (numpy computes, unpacks and compares
    without the GIL). A word holds ``64 / bits`` fields, the first in its lowest bits."""
    w0, w1 = first * bits // 64, -(-last * bits // 64)
    raw = _stream_words(w0, w1, key).astype("<u8", copy=False).view(np.uint8)
    raw = raw[first * bits // 8 - 8 * w0 : last * bits // 8 - 8 * w0]
    if bits == 1:
        raw = np.unpackbits(raw, bitorder="little")
    elif bits == 16:
        raw = raw.view("<u2")
    np.greater_equal(raw, threshold, out=out)


def _stream_words(w0: int, w1: int, key: int) -> np.ndarray:
    """Words ``w0:w1`` of the stream keyed by ``key``: word ``w`` is SplitMix64's output at ``w + 1`` from ``key``
    (its finaliser of ``key + (w + 1) * golden``), as ``csrc/dropout.c`` computes it. Each word is a function of its
    index alone, so any block of a mask is drawn straight away, by numpy's wrapping uint64 arithmetic or by the
    kernel's vectorised loop."""
    z = np.arange(w0 + 1, w1 + 1, dtype=np.uint64)
    z *= np.uint64(_GOLDEN)
    z += np.uint64(key)
    for shift, factor in _MIX:
        z ^= z >> np.uint64(shift)
        z *= np.uint64(factor)
    z ^= z >> np.uint64(31)
    return z


def device_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """:func:`stream_keep_mask` drawn by torch's ops on ``device`` (a GPU without the Triton kernel, which draws the
    same fields as it drops: ntp.engine.kernels.cuda_dropout). int64 arithmetic wraps as uint64's does; its right shifts are
    arithmetic, so each is masked to a logical one."""
    bits, threshold = field(p)
    first, last = rows[0] * width, rows[1] * width
    w0, w1 = first * bits // 64, -(-last * bits // 64)
    z = torch.arange(w0 + 1, w1 + 1, dtype=torch.int64, device=device)
    z.mul_(_signed(_GOLDEN)).add_(_signed(stream_key(stream)))
    for shift, factor in _MIX:
        z.bitwise_xor_(_logical_shift(z, shift)).mul_(_signed(factor))
    raw = z.bitwise_xor_(_logical_shift(z, 31)).view(torch.uint8)  # little-endian words, as on every GPU and x86
    if bits == 1:
        keep = (raw[:, None] >> torch.arange(8, dtype=torch.uint8, device=device)).bitwise_and_(1).view(torch.bool)
    elif bits == 8:
        keep = raw >= threshold
    else:  # an unsigned 16-bit comparison in int16: both sides moved down by 2^15
        keep = raw.view(torch.int16).bitwise_xor(-(1 << 15)) >= threshold - (1 << 15)
    skip = first - w0 * 64 // bits
    return keep.flatten()[skip : skip + last - first].view(rows[1] - rows[0], width)


def _logical_shift(z: torch.Tensor, shift: int) -> torch.Tensor:
    return (z >> shift).bitwise_and_((1 << (64 - shift)) - 1)


def _signed(v: int) -> int:
    """The int64 with the bits of the uint64 ``v``."""
    return v - (1 << 64) if v >= 1 << 63 else v
