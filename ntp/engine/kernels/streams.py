"""The numbers that key a run's random streams (dropout masks: ntp.engine.kernels.masks; embedding initialisation:
ntp.engine.nn.embedding; the link task's sampling), each purpose in its own space. A stream is the run's seed's key plus fields packed into
disjoint bits (purpose, step, layer, part), modulo 2^64: within a run two different (purpose, step, layer, part)
never share a stream, and :func:`masks.stream_key <ntp.engine.kernels.masks.stream_key>` maps distinct streams to
distinct keys (it is a bijection of 64-bit words). Products of primes, as before, collided within ordinary runs."""

from __future__ import annotations

from enum import IntEnum

from ntp.engine.kernels.masks import stream_key

_STEP_BITS, _LAYER_BITS, _PART_BITS = 36, 12, 12
_LAYER_SHIFT = _PART_BITS
_STEP_SHIFT = _LAYER_SHIFT + _LAYER_BITS
_PURPOSE_SHIFT = _STEP_SHIFT + _STEP_BITS  # 60: 4 bits of purpose


class Purpose(IntEnum):
    """What a stream is drawn for; each has its own 2^60 streams of a run."""

    ENCODER = 1  #: the node encoder's dropout (a layer's input; step: the optimiser step)
    DECODER = 2  #: the link decoder's dropout (layer: the decoder's hidden layer)
    HETERO = 3  #: R-GCN's dropout (part: the node type's index)
    EMBEDDING = 4  #: embedding initialisation (step: the tile of rows, layer: the table)
    SAMPLING = 5  #: the link task's order of edges and negative pairs (step: the epoch)


def stream(purpose: Purpose, seed: int, step: int, layer: int = 0, part: int = 0) -> int:
    """The stream of ``purpose`` at (``step``, ``layer``, ``part``) in a run seeded ``seed`` (a 64-bit word)."""
    for name, value, bits in (("step", step, _STEP_BITS), ("layer", layer, _LAYER_BITS), ("part", part, _PART_BITS)):
        if not 0 <= value < 1 << bits:
            raise ValueError(f"a random stream's {name} must be in [0, 2^{bits}), not {value}")
    fields = int(purpose) << _PURPOSE_SHIFT | step << _STEP_SHIFT | layer << _LAYER_SHIFT | part
    return (stream_key(seed) + fields) % 2**64


def with_layer(base: int, layer: int) -> int:
    """The stream of layer ``layer`` from ``base``, a :func:`stream` of layer 0 (the link decoder is handed one
    stream a step and keys each of its layers from it)."""
    if not 0 <= layer < 1 << _LAYER_BITS:
        raise ValueError(f"a random stream's layer must be in [0, 2^{_LAYER_BITS}), not {layer}")
    return (base + (layer << _LAYER_SHIFT)) % 2**64
