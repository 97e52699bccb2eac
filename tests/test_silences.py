"""The packet times a server partition keeps of the whole capture (``analyzer.kernels.silences``) have the
span and the long silences of every packet's times, with the same packets either side (issue 13).

The oracle is what ``tcp_stall``'s ``capture_silences`` computes of ``packets``: a stable sort by time, and
each packet whose predecessor is ``gap_ns`` or more before it.
"""
from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.kernels.silences import SPAN_ONLY_NS, silence_kept, thinned_times


def _silences(times: pl.DataFrame, gap_ns: int) -> list[tuple[int, int, int, int]]:
    pk = times.sort("ts_ns", maintain_order=True)
    return pk.with_columns(pl.col("ts_ns").shift(1).alias("g0"), pl.col("frame").shift(1).alias("g0_frame")) \
        .filter((pl.col("ts_ns") - pl.col("g0")) >= gap_ns) \
        .select("g0", "ts_ns", "g0_frame", "frame").rows()


def _span(times: pl.DataFrame) -> tuple[int, int]:
    return times["ts_ns"].min(), times["ts_ns"].max()


def _times(steps: list[int], start: int = 1_000) -> pl.DataFrame:
    ts = start + np.cumsum(np.asarray(steps, np.int64))
    return pl.DataFrame({"frame": np.arange(1, len(steps) + 1, dtype=np.uint32), "ts_ns": ts})


def _thinned_in_chunks(times: pl.DataFrame, cuts: list[int], gap_ns: int) -> pl.DataFrame:
    """As a reader thins them: each chunk, then the concatenation (analyzer.ingest.read_tables)."""
    edges = [0, *sorted(set(c % (times.height + 1) for c in cuts)), times.height]
    chunks = [thinned_times(times.slice(a, b - a), gap_ns) for a, b in zip(edges, edges[1:]) if b > a]
    return thinned_times(pl.concat(chunks), gap_ns)


# times in steps of 0 .. 30 (ties and silences), the silence length among those steps
STEPS = st.lists(st.integers(0, 30), min_size=1, max_size=300)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, gap_ns=st.integers(1, 40), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_thinned_times_have_every_silence_and_the_span(steps, gap_ns, cuts):
    times = _times(steps)
    for kept in (thinned_times(times, gap_ns), _thinned_in_chunks(times, cuts, gap_ns)):
        assert _silences(kept, gap_ns) == _silences(times, gap_ns)
        assert _span(kept) == _span(times)
        assert kept.join(times, on=["frame", "ts_ns"], how="anti").height == 0  # the packets' own rows


@settings(max_examples=200, deadline=None)
@given(steps=STEPS, gap_ns=st.integers(1, 40), cuts=st.lists(st.integers(0, 400), max_size=6),
       swaps=st.lists(st.tuples(st.integers(0, 299), st.integers(0, 299)), max_size=4))
def test_times_out_of_order_keep_their_silences_too(steps, gap_ns, cuts, swaps):
    """A capture whose times go back (merged interfaces, a clock step): each chunk is thinned in its
    stable sort's order, and the silences after a stable sort are still every packet's."""
    ts = _times(steps)["ts_ns"].to_numpy().copy()
    for a, b in swaps:
        if a < ts.shape[0] and b < ts.shape[0]:
            ts[a], ts[b] = ts[b], ts[a]
    times = pl.DataFrame({"frame": np.arange(1, ts.shape[0] + 1, dtype=np.uint32), "ts_ns": ts})
    kept = _thinned_in_chunks(times, cuts, gap_ns)
    assert _silences(kept, gap_ns) == _silences(times, gap_ns)
    assert _span(kept) == _span(times)
    assert kept.join(times, on=["frame", "ts_ns"], how="anti").height == 0


def test_few_times_are_kept_when_the_silence_is_long():
    """A second of packets 1 us apart with one 50 ms hole: looking for silences of 10 ms keeps the
    two ends, the hole's two packets and a time every 10 ms or so; the span alone keeps the ends."""
    steps = [1_000] * 1_000_000
    steps[400_000] = 50_000_000
    times = _times(steps)
    kept = thinned_times(times, 10_000_000)
    assert _silences(kept, 10_000_000) == _silences(times, 10_000_000) and len(_silences(times, 10_000_000)) == 1
    assert kept.height <= 2 * (1_049_999_000 // 10_000_000) + 4
    assert thinned_times(times, SPAN_ONLY_NS)["frame"].to_list() == [1, 1_000_000]


def test_a_silence_ends_on_the_last_of_equal_times():
    ts = np.asarray([0, 5, 5, 5, 20, 20, 21], np.int64)
    keep = silence_kept(ts, np.int64(10))
    assert keep.tolist() == [True, False, False, True, True, False, True]
    assert silence_kept(np.asarray([3, 1, 2], np.int64), np.int64(1)).tolist() == [True, True, True]  # out of order
