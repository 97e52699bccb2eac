"""Rows put in order by an arg sort and one gather (``analyzer.wide_frames``) are Polars' stable sort's."""
from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.wide_frames import in_order, sorted_rows


def test_in_order_is_the_lexicographic_order():
    frame = pl.DataFrame({"a": [1, 1, 2, 2, 3], "b": [5, 7, 0, 0, 1], "c": [0, 0, 1, 2, 0]})
    assert in_order(frame, ("a", "b", "c")) and in_order(frame, ("a",)) and in_order(frame.head(1), ("b",))
    assert not in_order(frame, ("b",))
    assert not in_order(frame.with_columns(pl.Series("c", [0, 0, 2, 1, 0])), ("a", "b", "c"))  # the last key
    assert not in_order(frame.reverse(), ("a", "b", "c"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.text(max_size=3) | st.none()), max_size=60),
       st.sampled_from([("a",), ("a", "b"), ("b", "a")]))
def test_sorted_rows_are_the_stable_sort(rows, by):
    frame = pl.DataFrame(rows, schema={"a": pl.Int64, "b": pl.UInt8, "s": pl.String}, orient="row") \
        .with_row_index("position")
    want = frame.sort(by, maintain_order=True)
    got = sorted_rows(frame, by)
    assert got.equals(want)  # ties keep their positions
    assert in_order(got, by) and (not in_order(frame, by) or got is frame)
