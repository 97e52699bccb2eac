"""Rows put in order by an arg sort and one gather (``analyzer.wide_frames``) are Polars' stable sort's; a
gather that lets the source go, and row-wise values computed a slice at a time, are the same values."""
from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import wide_frames
from analyzer.wide_frames import gathered, in_order, row_wise, sorted_held, sorted_rows


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


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.text(max_size=3) | st.none()), min_size=1, max_size=40), st.data())
def test_a_gather_that_lets_go_is_a_gather(rows, data):
    frame = pl.DataFrame(rows, schema={"a": pl.Int64, "s": pl.String}, orient="row").with_row_index("position")
    picked = pl.Series(data.draw(st.lists(st.integers(0, frame.height - 1), max_size=50)), dtype=pl.UInt32)
    held = [frame.clone()]
    assert gathered(held, picked).equals(frame[picked]) and held == []
    held = [frame.clone()]
    assert sorted_held(held, ("a",)).equals(frame.sort("a", maintain_order=True)) and held == []


def test_row_wise_values_are_the_same_a_slice_at_a_time(monkeypatch):
    frame = pl.DataFrame({"a": [str(k % 7) if k % 5 else None for k in range(1000)], "b": list(range(1000))})
    for expr in (pl.struct("a", "b").hash(), pl.concat_str("a", "b", separator="|")):
        whole = frame.select(expr).to_series()
        monkeypatch.setattr(wide_frames, "ROW_WISE_SLICE_ROWS", 64)
        assert row_wise(frame, expr).equals(whole) and row_wise(frame, expr).n_chunks() == 1
        monkeypatch.undo()
