"""A wide frame's rows cut and put in order without holding the frame twice.

``DataFrame.sort`` gathers every column while it still holds the sorting's own copies: on the LDAP
server's partition of the 10M synth capture (666k messages of 48 columns, a dozen of them text) the
stable sort of the decoded batches peaked at +480 MB, an arg sort of the keys and one gather of the
rows at +263 MB (the result itself), the rows the same. A frame already in order (a builder's
batches of one connection, the messages its builder sorted) need not be gathered at all. And a
filter of a wide frame copies every column of the rows it keeps: selecting the few columns wanted
first copies only those.
"""
from __future__ import annotations

import polars as pl


def in_order(frame: pl.DataFrame, by: tuple[str, ...]) -> bool:
    """Whether ``frame``'s rows are sorted by ``by`` (ascending, lexicographically; no nulls in them)."""
    if frame.height < 2:
        return True
    after = pl.lit(False)  # strictly after the previous row on the keys so far
    equal = pl.lit(True)  # equal to it on them
    for c in by:
        col, prev = pl.col(c), pl.col(c).shift(1)
        after, equal = after | (equal & (col > prev)), equal & (col == prev)
    return bool(frame.select((after | equal).slice(1).all()).item())


def sorted_rows(frame: pl.DataFrame, by: tuple[str, ...]) -> pl.DataFrame:
    """``frame``'s rows in the stable order of ``by`` (as ``frame.sort(by, maintain_order=True)``):
    itself when already in order, else one gather by the keys' stable arg sort; sorted by
    ``DataFrame.sort`` when the keys have nulls (:func:`in_order` does not judge those)."""
    return sorted_held([frame], by)


def sorted_held(held: list[pl.DataFrame], by: tuple[str, ...]) -> pl.DataFrame:
    """:func:`sorted_rows` of the frame ``held[0]``; when the caller gives it up (``held`` holds its
    only reference; it is emptied), gathered with :func:`gathered`, so the frame and its sorted copy
    are not both held whole (a merge of a big server's shards: its frame's size less)."""
    frame = held[0]
    if frame.select(pl.any_horizontal(pl.col(list(by)).is_null().any())).item():
        return held.pop().sort(by, maintain_order=True)
    if in_order(frame, by):
        return held.pop()
    rows = frame.select(pl.arg_sort_by(*by, maintain_order=True)).to_series()
    del frame
    return gathered(held, rows)


def concat_in_order(frames: list[pl.DataFrame], by: tuple[str, ...], empty: pl.DataFrame) -> pl.DataFrame:
    """``frames`` (a decoder's batches) as one, in the stable order of ``by`` (:func:`sorted_rows`);
    ``empty`` when there are none."""
    if not frames:
        return empty
    return sorted_rows(pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0], by)


def columns_among(frame: pl.DataFrame, wanted) -> pl.DataFrame:
    """``frame``'s columns that are among ``wanted``, in its own order (a frame narrowed to what its
    readers read)."""
    kept = set(wanted)
    return frame.select([c for c in frame.columns if c in kept])


def gathered(held: list[pl.DataFrame], rows: pl.Series) -> pl.DataFrame:
    """The rows ``rows`` of the frame ``held[0]``, which the caller gives up (``held`` is emptied and
    holds its only reference): gathered a column at a time, each of its columns let go of once
    gathered, so the frame and its gathered copy are never both held whole (``frame[rows]`` holds
    both: for toctou's 2.7M events of the 10M synth capture's LDAP server at 10x, ~630 MB more)."""
    columns = held.pop().get_columns()
    out = []
    for k in range(len(columns)):
        out.append(columns[k].gather(rows))
        columns[k] = None
    return pl.DataFrame(out)


# rows evaluated at a time by row_wise: its transients are a slice's, not the frame's
ROW_WISE_SLICE_ROWS = 1 << 20


def row_wise(frame: pl.DataFrame, expr: pl.Expr) -> pl.Series:
    """``frame.select(expr)`` for an expression whose value in a row depends on that row alone (a
    hash of some columns, a concatenation), evaluated a slice of :data:`ROW_WISE_SLICE_ROWS` rows at a
    time: hashing a struct of text columns whole held ~80 bytes a row besides the result
    (retry_storm's 7.2M sends of the 10M synth capture's DNS server at 10x: ~570 MB)."""
    if frame.height <= ROW_WISE_SLICE_ROWS:
        return frame.select(expr).to_series()
    return pl.concat([frame.slice(start, ROW_WISE_SLICE_ROWS).select(expr).to_series()
                      for start in range(0, frame.height, ROW_WISE_SLICE_ROWS)], rechunk=True)


def selected_rows(frame: pl.DataFrame, where: pl.Expr, *columns) -> pl.DataFrame:
    """``columns`` (names or expressions) of the rows of ``frame`` where ``where`` holds, selected before
    they are filtered, so only they are copied."""
    return frame.select(*columns, where.alias("_where")).filter("_where").drop("_where")
