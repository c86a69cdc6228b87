"""Streaming reads of the .npy members of an .npz file, without loading whole arrays.

An .npz is a zip of .npy files, each stored or deflated. A member's header (dtype, shape,
order) is parsed with numpy.lib.format; its data is then read in blocks along one axis of a
2-D array (rows of node features, columns of a [2, E] edge index):

- stored members are read straight from the zip file at the member's offset (random access);
- deflated members are decompressed sequentially through zipfile (one stream per "lane":
  e.g. a C-order [2, E] array needs two streams, one per row).

Memory is bounded by the block size, whatever the array's size.
"""

from __future__ import annotations

import struct
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
from numpy.lib import format as npformat

from storage.schema import StoreError
from storage.sources.fileerrors import guarded, reading

BLOCK_BYTES = 32 << 20  # bytes per block yielded (all lanes together)
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # zip local file header (30 bytes)
_LOCAL_MAGIC = b"PK\x03\x04"


def _bad(path: Path, problem: str) -> StoreError:
    return StoreError(
        f"{path}: {problem}. Fix: the file is damaged or not an OGB binary dataset; "
        "download it again (delete the folder and prepare again)"
    )


@dataclass(frozen=True)
class NpyMember:
    """One array inside an .npz: where its data starts and how it is laid out."""

    path: Path
    key: str
    member: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    compressed: bool
    header_len: int  # bytes of the .npy header before the data
    data_offset: int | None  # absolute offset of the data in the zip file (stored members only)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def _open_at(self, stack: ExitStack, zf: zipfile.ZipFile, elem: int) -> BinaryIO:
        """A stream positioned at element `elem` of the raw data."""
        byte = elem * self.dtype.itemsize
        if self.data_offset is not None:
            f = stack.enter_context(open(self.path, "rb"))
            f.seek(self.data_offset + byte)
            return f
        f = stack.enter_context(zf.open(self.member))
        _skip(f, self.header_len + byte, self)
        return f

    def read_all(self) -> np.ndarray:
        """The whole array (only for small arrays such as the count lists)."""
        with reading(self.path), zipfile.ZipFile(self.path) as zf, zf.open(self.member) as f:
            return npformat.read_array(f, allow_pickle=False)

    def iter_blocks(self, axis: int, block_bytes: int | None = None) -> Iterator[np.ndarray]:
        """Yield consecutive blocks of a 2-D array along `axis`, each with the other axis whole.

        axis=0 gives [rows, cols] blocks (a 1-D array reads as [n, 1]); axis=1 gives [rows, k]
        column blocks. Block sizes aim
        at `block_bytes` (default BLOCK_BYTES) and are at least one slice. A truncated or damaged
        member raises StoreError naming the file.
        """
        return guarded(self.path, self._blocks(axis, block_bytes))

    def _blocks(self, axis: int, block_bytes: int | None) -> Iterator[np.ndarray]:
        shape = self.shape + (1,) if len(self.shape) == 1 and axis == 0 else self.shape
        if len(shape) != 2:
            raise _bad(self.path, f"{self.key} has shape {self.shape}, expected 2-D")
        length, other = shape[axis], shape[1 - axis]
        per_slice = max(other, 1) * self.dtype.itemsize
        step = max(1, (block_bytes or BLOCK_BYTES) // per_slice)
        # Contiguous along `axis` in memory order: one stream of interleaved slices.
        # Otherwise each index of the other axis is a contiguous "lane" of `length` elements.
        interleaved = (axis == 0) != self.fortran_order
        with ExitStack() as stack:
            zf = stack.enter_context(zipfile.ZipFile(self.path))
            if interleaved:
                streams = [self._open_at(stack, zf, 0)]
            else:
                streams = [self._open_at(stack, zf, lane * length) for lane in range(other)]
            for start in range(0, length, step):
                k = min(step, length - start)
                if interleaved:  # k slices of `other` elements, one after the other
                    block = np.empty((k, other), dtype=self.dtype)
                    _read_into(streams[0], block, self)
                    yield block if axis == 0 else block.T
                else:  # k elements from each lane
                    lanes = np.empty((other, k), dtype=self.dtype)
                    for lane, f in enumerate(streams):
                        _read_into(f, lanes[lane], self)
                    yield lanes.T if axis == 0 else lanes


def _skip(f: BinaryIO, nbytes: int, m: NpyMember) -> None:
    """Advance a (decompressing) stream by reading and discarding, in bounded pieces."""
    while nbytes > 0:
        got = len(f.read(min(nbytes, 16 << 20)))
        if got == 0:
            raise _bad(m.path, f"{m.key} ends early (truncated)")
        nbytes -= got


def _read_into(f: BinaryIO, out: np.ndarray, m: NpyMember) -> None:
    """Fill the contiguous array `out` with the stream's next bytes."""
    view = memoryview(out.reshape(-1).view(np.uint8))
    done, nbytes = 0, out.nbytes
    while done < nbytes:
        got = f.readinto(view[done:])
        if not got:
            raise _bad(m.path, f"{m.key} ends early (truncated)")
        done += got


def _read_header(f: BinaryIO, m_path: Path, key: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, header length) of the .npy stream at its start."""
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        else:  # (3, 0) only serves non-latin-1 field names: never a numeric array
            raise ValueError(f".npy format version {version} is not supported")
    except ValueError as e:
        raise _bad(m_path, f"{key} is not a valid .npy member ({e})") from None
    return tuple(int(s) for s in shape), bool(fortran), np.dtype(dtype), f.tell()


class NpzFile:
    """The members of an .npz, by key (without '.npy'); headers read lazily, data never."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with zipfile.ZipFile(self.path) as zf:
                self._infos = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
        except (zipfile.BadZipFile, OSError) as e:
            raise _bad(self.path, f"not a readable .npz ({e})") from None

    def keys(self) -> list[str]:
        return list(self._infos)

    def __contains__(self, key: str) -> bool:
        return key in self._infos

    def member(self, key: str) -> NpyMember:
        info = self._infos.get(key)
        if info is None:
            raise _bad(self.path, f"array {key!r} is missing (found {sorted(self._infos)})")
        with reading(self.path), zipfile.ZipFile(self.path) as zf, zf.open(info) as f:
            shape, fortran, dtype, header_len = _read_header(f, self.path, key)
        if dtype.hasobject:
            raise _bad(self.path, f"{key} holds Python objects, not numbers")
        stored = info.compress_type == zipfile.ZIP_STORED
        offset = self._data_start(info) + header_len if stored else None
        m = NpyMember(self.path, key, info.filename, shape, dtype, fortran, not stored, header_len, offset)
        if info.file_size - header_len != m.size * dtype.itemsize:
            raise _bad(
                self.path,
                f"{key} holds {info.file_size - header_len} data bytes but its "
                f"header says {shape} {dtype} ({m.size * dtype.itemsize} bytes)",
            )
        return m

    def _data_start(self, info: zipfile.ZipInfo) -> int:
        """Absolute offset of a member's bytes: after its local header, name and extra field."""
        with reading(self.path), open(self.path, "rb") as f:
            f.seek(info.header_offset)
            raw = f.read(_LOCAL_HEADER.size)
        if len(raw) != _LOCAL_HEADER.size:
            raise _bad(self.path, f"{info.filename}: truncated zip header")
        fields = _LOCAL_HEADER.unpack(raw)
        if fields[0] != _LOCAL_MAGIC:
            raise _bad(self.path, f"{info.filename}: bad zip local header")
        name_len, extra_len = fields[-2], fields[-1]
        return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
