"""Which of a rank's parts (ntp.engine.memory.parts) are alive at once. A step alternates two phases: the NN stage's
segments and propagation's products. A streamed NN stage's block lives only in its segments
(ntp.engine.parallel.row_stream frees it before a product starts: its rows wait in host memory), and a product's
float32 copies, and under ``--offload all`` the column blocks it streams, only in the product. A budget then holds
what stays, and the larger of the two phases' own: the chunks and column blocks get all the room but what a product
holds, and the NN block must fit beside what a segment holds (the topology too, where it stays on the device).
"""

from __future__ import annotations

#: parts alive only while a segment of a streamed NN stage runs
SEGMENT_PARTS = frozenset({"NN block"})
#: parts alive only while a product runs
PRODUCT_PARTS = frozenset({"float32 product input", "float32 product output", "column blocks"})


def beside_chunks(parts: dict[str, int]) -> int:
    """What a product holds beside its chunks: every part but the segments' own."""
    return sum(parts.values()) - segment_only(parts)


def segment_only(parts: dict[str, int]) -> int:
    """What only the NN stage's segments hold: a streamed NN block."""
    return sum(b for name, b in parts.items() if name in SEGMENT_PARTS)


def segment_bytes(parts: dict[str, int]) -> int:
    """What a segment of the NN stage holds: every part but a product's own."""
    return sum(b for name, b in parts.items() if name not in PRODUCT_PARTS)


def peak_bytes(parts: dict[str, int], chunk: int = 0) -> int:
    """A step's planned peak: the larger of a product's (its parts and a ``chunk``'s working set) and a
    segment's."""
    return max(beside_chunks(parts) + chunk, segment_bytes(parts))
