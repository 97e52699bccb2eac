"""NumPy arrays → Polars columns without copying, nulls from a validity mask."""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from .schema import Column

_ARROW_TYPES = {
    np.dtype(np.uint8): pa.uint8(), np.dtype(np.uint16): pa.uint16(), np.dtype(np.uint32): pa.uint32(),
    np.dtype(np.uint64): pa.uint64(), np.dtype(np.int8): pa.int8(), np.dtype(np.int16): pa.int16(),
    np.dtype(np.int32): pa.int32(), np.dtype(np.int64): pa.int64(), np.dtype(np.float64): pa.float64(),
}


def series(name: str, values: np.ndarray, valid: np.ndarray | None = None) -> pl.Series:
    """A Polars series over ``values`` (zero-copy); rows where ``valid`` is False are null."""
    values = np.ascontiguousarray(values)
    if valid is None or valid.all():
        return pl.Series(name, values)
    if values.dtype == np.bool_:
        return pl.Series(name, values).set(pl.Series(~valid), None)
    bitmap = np.packbits(valid, bitorder="little")
    array = pa.Array.from_buffers(_ARROW_TYPES[values.dtype], len(values),
                                  [pa.py_buffer(bitmap), pa.py_buffer(values)])
    return arrow_series(name, array)


def arrow_series(name: str, array) -> pl.Series:
    """A Polars series named ``name`` over the pyarrow ``array`` (by reference, through
    :class:`ArrowCArray`): what ``pl.Series(name, pl.from_arrow(array))`` gives, without importing
    ``pyarrow.compute``."""
    return pl.Series(name, pl.Series(ArrowCArray(array)))


class ArrowCArray:
    """An Arrow array seen only through the Arrow PyCapsule interface (``__arrow_c_array__``), so that
    Polars imports it by reference through the C data interface: the same zero-copy series as
    ``pl.from_arrow``, without the ``pyarrow.compute`` import (~40 ms of a process's start, issue 13)
    that ``pl.from_arrow``'s pyarrow path makes for chunked dictionary arrays this never holds."""

    def __init__(self, array):
        self.array = array

    def __arrow_c_array__(self, requested_schema=None):
        return self.array.__arrow_c_array__(requested_schema)


def frame(columns: tuple[Column, ...], arrays: dict[str, np.ndarray],
          present: np.ndarray | None = None) -> pl.DataFrame:
    """A frame in schema order. A column with a ``present`` bit is null where the bit is clear."""
    out = []
    for col in columns:
        if col.polars == pl.String:  # text columns come as lists (few rows: interfaces, sections)
            out.append(pl.Series(col.name, list(arrays[col.name]), dtype=pl.String))
            continue
        valid = None
        if col.present is not None and present is not None:
            valid = (present & int(col.present)) != 0
        s = series(col.name, arrays[col.name], valid)
        if isinstance(col.polars, pl.Enum):
            s = enum_from_codes(s, col.polars)
        elif col.polars is not None:
            s = s.cast(col.polars)
        out.append(s)
    return pl.DataFrame(out)


def enum_from_codes(codes: pl.Series, dtype: pl.Enum) -> pl.Series:
    """Integer codes (index into the Enum's categories; null stays null) → an Enum series."""
    return codes.cast(pl.UInt32).cat.to(dtype)
