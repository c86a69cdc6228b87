"""The communication cost model of ../shared/design/tensor-parallel.md, in bytes per rank per epoch.

Rows and columns are padded to multiples of the world size m (n' = m * ceil(n/m), d' = m * ceil(d/m)), so every
rank sends exactly the same amount: 4 all-to-alls (split and gather, forward and backward), each sending
n'/m * d'/m values to each of the m - 1 other ranks, i.e. n' * d'/m * (m-1)/m values.
"""

from __future__ import annotations

from ntp.engine.distributed.partition import ceil_div


def all_to_all_bytes(num_nodes: int, width: int, world: int, bytes_per_value: int = 4) -> int:
    """Bytes one rank sends in one split or gather of a ``width``-wide matrix."""
    if world == 1:
        return 0
    return ceil_div(num_nodes, world) * ceil_div(width, world) * (world - 1) * bytes_per_value


def decoupled_bytes(num_nodes: int, split_width: int, world: int, bytes_per_value: int = 4) -> int:
    """Decoupled training: 4 all-to-alls per epoch, whatever the depth."""
    return 4 * all_to_all_bytes(num_nodes, split_width, world, bytes_per_value)


def coupled_bytes(num_nodes: int, dims: list[int], world: int, bytes_per_value: int = 4) -> int:
    """Naive tensor parallelism over layers ``dims[i] -> dims[i + 1]`` (features first, classes last): each layer
    propagates at the narrower of its two widths (ntp.engine.nn.models.propagated_linear) with 4 all-to-alls, or 2
    when what it propagates is the input features themselves (no gradient flows back into them)."""
    return sum(
        (2 if i == 0 and a < b else 4) * all_to_all_bytes(num_nodes, min(a, b), world, bytes_per_value)
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]))
    )
