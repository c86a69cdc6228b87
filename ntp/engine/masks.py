"""Keep masks that are a function of (stream, global row, column) alone, so every world size drops the same
elements, each drawn in one vectorised pass: on a CPU the fields of a counter-based stream of words (numpy here; the C
kernel, ``csrc/dropout.c``, draws the same words as it applies them), on CUDA windows of a hashed table (no per-tile
kernels). ntp.engine.dropout applies them."""
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
    function of ``(stream, r, c)`` alone, so every world size draws the same mask for the same element, in one
    vectorised pass: a field of a counter-based stream at the element's index on CPU, windows of a hashed table on
    CUDA (no per-tile kernels)."""
    if device.type == "cpu":
        return stream_keep_mask(rows, width, p, stream)
    return window_keep_mask(rows, width, p, stream, device)


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


#: entries of the keep table whose windows a CUDA mask's rows are (a power of two; about 0.1 ms to draw on a GPU)
_TABLE_ENTRIES = 1 << 22


def window_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Row ``r`` of the mask is the ``width`` entries of a keep table (drawn for ``stream`` by
    :func:`hash_keep_mask`, 4M entries whatever the graph) that start at a hash of ``(stream, r)``, rounded down to a
    multiple of 8: one gather of 8-entry words instead of a dozen hash passes over each element (entry by entry, the
    gather took 0.75 ms for 2.4M x 100 on an H200; as words it left the epoch profile's top 25). Two rows' windows
    overlap with probability about ``2 width / 4M``; everything else is as independent as the hash."""
    words = -(-width // 8)
    table = hash_keep_mask((0, -(-(_TABLE_ENTRIES + 8 * words) // 64)), 64, p, stream, device).flatten()
    salt = stream_key(stream) ^ 0xA5A5A5A5A5A5A5A5
    start = _row_hash(rows, salt, device).bitwise_and_(_TABLE_ENTRIES // 8 - 1)
    packed = table.view(torch.int64).unfold(0, words, 1)[start.long()]  # [rows, words]: 8 entries a word
    return packed.view(torch.bool)[:, :width]


def _row_hash(rows: tuple[int, int], stream: int, device: torch.device) -> torch.Tensor:
    """A well-mixed int32 per global row of ``rows``, a function of ``(stream, row)``."""
    s = stream_key(stream)
    r = torch.arange(rows[0], rows[1], device=device, dtype=torch.int64)
    return _fmix32(_to_int32((r * 0x9E3779B1 + (s & 0xFFFFFFFF)) & 0xFFFFFFFF)) ^ _to_int32(torch.tensor(s >> 32))


def hash_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Element ``(r, c)`` keeps when 24 bits of ``fmix32(key(stream, r) ^ key(c))`` (MurmurHash3's finaliser, in
    wrapping int32 arithmetic) are at least ``p * 2^24``: a few elementwise kernels on any device."""
    row_key = _row_hash(rows, stream, device)
    col_key = _fmix32(torch.arange(width, device=device, dtype=torch.int32) * 0x27D4EB2F + 0x165667B1)
    bits = _fmix32(row_key[:, None] ^ col_key[None, :])
    return bits.bitwise_and_(0xFFFFFF) >= int(round(p * (1 << 24)))


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """The int32 with the same low 32 bits as the non-negative int64 ``x``."""
    return (x & 0xFFFFFFFF).sub_(x.ge(1 << 31).long() << 32).to(torch.int32)


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ ((x >> 16) & 0xFFFF)  # masked: int32 shifts are arithmetic
    x = x * -2048144789  # 0x85EBCA6B as int32; products wrap
    x = x ^ ((x >> 13) & 0x7FFFF)
    x = x * -1028477387  # 0xC2B2AE35
    return x ^ ((x >> 16) & 0xFFFF)
