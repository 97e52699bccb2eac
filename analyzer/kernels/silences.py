"""The packet times of a capture thinned to what its span and its long silences need: what a server
partition keeps of every packet of the whole capture (``analyzer.capture.ReadPart.silence_ns``).

A detector run on one server partition still reads the whole capture's ``packets`` (frame, ts_ns), for
two things only (``detectors/base.py``, ``SILENCE``): the first and last timestamp, and the silences of
at least ``gap_ns`` (no packet from anyone; ``tcp_stall``'s ``capture_gap``). Keeping every packet's
time costs 12 bytes a packet of the whole capture in every partition (1.2 GB each at 100M packets).

:func:`silence_kept` keeps, of times in non-decreasing order, the first and the last and a packet
``j`` whenever dropping it would leave the next packet ``gap_ns`` or more after the last one kept.
So two consecutive kept times either were consecutive packets or are less than ``gap_ns`` apart:
every silence of at least ``gap_ns`` between kept times is one of the packets' own, with the same
packet either side (the last of equal times before it, as a stable sort orders them), and each of
the packets' own silences is kept (both its ends are). At most ``2 * span / gap_ns + 2`` times are
kept, besides the ends of the silences. Times out of order (merged interfaces, a clock step) are
thinned in the order a stable sort puts them, which is the order the silences are read in.

The rule composes: thinning the concatenation of thinned runs keeps the same silences as thinning
the whole (a run's kept times bracket every time it dropped within less than ``gap_ns``, and equal
times keep their capture order), so a reader thins each chunk as it reads it and the concatenation
once at the end (:func:`thinned_times`); the rows kept are always some of the packets' own rows.
"""
import numpy as np
import polars as pl

from ..jit import njit

KEEP_EVERY_TIME = None  # silence_ns meaning "thin nothing" (every packet's time is kept)
SPAN_ONLY_NS = np.iinfo(np.int64).max  # silence_ns meaning "no silence is looked for": the ends only


@njit(cache=True)
def silence_kept(ts_ns, gap_ns):
    """bool per time, in non-decreasing order: kept (module doc); everything when they are not in order."""
    n = ts_ns.shape[0]
    keep = np.zeros(n, np.bool_)
    for i in range(1, n):
        if ts_ns[i] < ts_ns[i - 1]:
            keep[:] = True
            return keep
    if n == 0:
        return keep
    keep[0] = True
    keep[n - 1] = True
    last = ts_ns[0]
    for j in range(1, n - 1):
        if ts_ns[j + 1] - last >= gap_ns:
            keep[j] = True
            last = ts_ns[j]
    return keep


def thinned_times(times: pl.DataFrame, gap_ns: int | None) -> pl.DataFrame:
    """The rows of ``times`` (frame, ts_ns, in capture order) that :func:`silence_kept` keeps for silences
    of ``gap_ns`` (:data:`SPAN_ONLY_NS`: only the ends), in time order (a stable sort's, when they
    were not); ``gap_ns`` None (:data:`KEEP_EVERY_TIME`): all of them as they are."""
    if gap_ns is KEEP_EVERY_TIME or times.height < 3:
        return times
    if not times["ts_ns"].is_sorted():
        times = times.sort("ts_ns", maintain_order=True)
    keep = silence_kept(times["ts_ns"].cast(pl.Int64).to_numpy(), np.int64(gap_ns))
    return times if keep.all() else times.filter(pl.Series(keep))
