"""Balanced partitions of vertex ids (row layout) and feature columns (column layout)."""

from __future__ import annotations


def balanced_bounds(total: int, parts: int) -> list[int]:
    """Offsets of ``parts`` contiguous ranges covering ``range(total)``; sizes differ by at most 1."""
    base, extra = divmod(total, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return bounds


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Partition:
    """Who owns which rows and which columns, for ``world`` ranks over ``num_nodes`` vertices."""

    def __init__(self, num_nodes: int, world: int, rank: int) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of size {world}")
        self.num_nodes = num_nodes
        self.world = world
        self.rank = rank
        self.row_bounds = balanced_bounds(num_nodes, world)
        #: Rows per rank after padding: every all-to-all block has this many rows, so bytes are balanced.
        self.padded_rows = ceil_div(num_nodes, world)

    def rows(self, rank: int | None = None) -> tuple[int, int]:
        r = self.rank if rank is None else rank
        return self.row_bounds[r], self.row_bounds[r + 1]

    def num_rows(self, rank: int | None = None) -> int:
        start, stop = self.rows(rank)
        return stop - start

    def col_bounds(self, width: int) -> list[int]:
        return balanced_bounds(width, self.world)

    def cols(self, width: int, rank: int | None = None) -> tuple[int, int]:
        b = self.col_bounds(width)
        r = self.rank if rank is None else rank
        return b[r], b[r + 1]

    def padded_cols(self, width: int) -> int:
        return ceil_div(width, self.world)
