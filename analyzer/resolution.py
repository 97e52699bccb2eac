"""The timestamp tick a capture really has, inferred from its timestamps.

A file's header declares a resolution (pcap magic: µs or ns; pcapng ``if_tsresol``), but what the
timestamps can show is set by the clock that made them: a nanosecond-magic file written by a tool
that rounds to 10 ms (a jiffies clock, a converter, a merge through a coarse format) still ticks in
10 ms steps. Every duration shorter than that tick is invisible in the capture, however fine the
header says it is.

The rule, per interface, over the differences between its consecutive packet timestamps (in file
order; only packet records, differences of zero ignored — equal timestamps say nothing about the
tick, and differences are independent of ``if_tsoffset`` and of any constant offset):

1. the largest power of ten ``P`` (1 ns .. 1 s) that divides at least ``MIN_ON_TICK_SHARE`` of the
   differences (tried upwards, stopping at the first that fails);
2. then the largest multiplier ``m`` in 2 .. 9 such that ``m x P`` divides that share of them
   (a 4 ms jiffies clock, HZ=250, is ``4 x 1 ms``); the tick is ``m x P`` (at most 1 s);
3. the effective resolution is the coarser of that tick and the declared one.

Robust to a few outliers: up to ``1 - MIN_ON_TICK_SHARE`` of the differences may be off the tick (one
stray timestamp spoils two differences). Genuine nanosecond captures stay at 1 ns (a random
difference is a multiple of 10 ns one time in ten) and µs pcaps at 1000 ns.

Too few timestamps to tell: by chance ``k`` random differences are all multiples of a tick twice the
true one with probability ``2**-k``; below ``MIN_DIFFERENCES`` nonzero differences the data cannot
tell a coarse clock from luck, so nothing is inferred: the effective resolution is the declared one
and ``effective_resolution_samples`` says how little there was (``herdscope info`` says so).

The differences are sampled (:class:`TickSampler`): every ``s``-th nonzero one of an interface, ``s``
the smallest power of two leaving at most ``2 x SAMPLE_DIFFERENCES``, the same whether the packets
come at once or chunk by chunk as a reader reads them (a scan in partitions keeps no column of every
packet). Cost: one ``diff`` over the timestamps, then the tests on the sample.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from .schema import ParseStatus

NOT_PACKET = ParseStatus.NOT_PACKET.name.lower()  # pcapng custom/journal records: no packet time of their own

# Fewer nonzero timestamp differences than this on an interface: the tick is not inferred (chance
# alignment of k differences on a tick 2x too coarse has probability 2**-k: 2**-16 at 16).
MIN_DIFFERENCES = 16
# A candidate tick must divide at least this share of an interface's nonzero differences (the rest
# are tolerated outliers: a few packets stamped by another clock, an edited timestamp).
MIN_ON_TICK_SHARE = 0.99
# The coarsest tick inferred: beyond a second, regular spacing is traffic, not a clock.
MAX_TICK_NS = 1_000_000_000
# The rule is tested on this many to twice as many nonzero differences per interface (all of them when
# it has fewer), evenly spread (every s-th, s a power of two: TickSampler): the share on the tick is
# then known to about ±0.1 %, and a 10M-packet capture costs a few ms, not seconds of int64 division.
SAMPLE_DIFFERENCES = 1 << 16
# Multipliers of the power of ten tried (2 x, 5 x ... 9 x): their common multiple, so one modulo
# and one histogram test them all.
_MULTIPLIERS = tuple(range(9, 1, -1))
_LCM = 2520  # lcm(1..9)


# A duration within this many ticks of the resolution is shown as approximate (± one tick).
APPROXIMATE_TICKS = 10


def is_limited(ns: float | int | None, res_ns: float | None) -> bool:
    """Whether a duration ``ns`` measured on timestamps of tick ``res_ns`` is within
    ``APPROXIMATE_TICKS`` ticks of it (ticks of 1 ns or finer limit nothing herdscope shows)."""
    return not (ns is None or res_ns is None or res_ns <= 1.0 or ns != ns  # NaN
                or ns >= APPROXIMATE_TICKS * res_ns)


def limited_text(ns: float | int | None, res_ns: float | None, fmt) -> str:
    """``fmt(ns)``, unless the timestamp tick ``res_ns`` limits what the capture can show: a duration
    shorter than one tick is "< tick (the capture's timestamp tick)" (it may be anything from 0 to one
    tick), one within ``APPROXIMATE_TICKS`` ticks is "~value (± the tick)"."""
    if not is_limited(ns, res_ns):
        return fmt(ns)
    if ns < res_ns:
        return f"< {fmt(res_ns)} (the capture's timestamp tick)"
    return f"~{fmt(ns)} (± the {fmt(res_ns)} timestamp tick)"


def capture_tick(interfaces: pl.DataFrame) -> float | None:
    """The coarsest effective tick (ns) among the interfaces that carry packets (all of them when
    none has two distinct timestamps); the declared ``ts_resolution_ns`` for a frame without the
    effective column; None without interfaces. What every claim about durations is limited by."""
    if interfaces.height == 0:
        return None
    col = "effective_resolution_ns" if "effective_resolution_ns" in interfaces.columns else "ts_resolution_ns"
    if "effective_resolution_samples" in interfaces.columns:
        used = interfaces.filter(pl.col("effective_resolution_samples") > 0)  # unused interfaces limit nothing
        interfaces = used if used.height else interfaces
    return float(interfaces[col].max())


def _on_share(d: np.ndarray, tick: int) -> float:
    return float(np.count_nonzero(d % tick == 0)) / len(d)


def infer_tick(diffs: np.ndarray, *, min_differences: int = MIN_DIFFERENCES,
               min_share: float = MIN_ON_TICK_SHARE, max_tick_ns: int = MAX_TICK_NS) -> int | None:
    """The tick (ns) of timestamps whose nonzero consecutive differences are ``diffs`` (int64), or
    None when there are fewer than ``min_differences`` of them. Vectorised: one modulo per power of
    ten tried, one for all the multipliers."""
    d = np.asarray(diffs, dtype=np.int64)
    d = d[d != 0]
    if len(d) < min_differences:
        return None
    power = 1
    while power * 10 <= max_tick_ns and _on_share(d, power * 10) >= min_share:
        power *= 10
    on = d[d % power == 0]
    # residues of d / power modulo lcm(2..9): q is a multiple of m exactly when its residue is
    residues = np.bincount(((on // power) % _LCM).astype(np.int64), minlength=_LCM)
    idx = np.arange(_LCM)
    for m in _MULTIPLIERS:
        if power * m > max_tick_ns:
            continue
        if residues[idx % m == 0].sum() >= min_share * len(d):
            return power * m
    return power


class TickSampler:
    """The nonzero differences between consecutive timestamps of each interface, taken chunk by chunk
    of packets in file order (:meth:`add`: a reader's chunks, or a whole packets frame at once, alike):
    how many there are, and every ``s``-th of them, ``s`` the smallest power of two leaving at most
    ``2 x SAMPLE_DIFFERENCES`` (doubled, and every other sample dropped, as they come), so that the
    sample is the same however the packets were cut into chunks, and a capture of any size holds at
    most that many differences per interface. Records without a packet time (``not_packet``) are left out."""

    def __init__(self):
        self.last: dict[int, int] = {}  # interface -> its last timestamp so far
        self.count: dict[int, int] = {}  # interface -> its nonzero differences so far
        self.stride: dict[int, int] = {}
        self.kept: dict[int, list[np.ndarray]] = {}  # interface -> its sampled differences, in pieces
        self.kept_len: dict[int, int] = {}

    def add(self, ts_ns: np.ndarray, iface: np.ndarray, keep: np.ndarray | None = None) -> None:
        """The next packets' timestamps and interfaces (``keep``: which are packets with a time)."""
        ts_ns, iface = np.asarray(ts_ns, np.int64), np.asarray(iface)
        if keep is not None and not keep.all():
            ts_ns, iface = ts_ns[keep], iface[keep]
        if len(ts_ns) == 0:
            return
        if (iface == iface[0]).all():
            self._add_one(int(iface[0]), ts_ns)
            return
        order = np.argsort(iface, kind="stable")  # each interface's timestamps, in file order
        ts_ns, iface = ts_ns[order], iface[order]
        starts = np.flatnonzero(np.r_[True, iface[1:] != iface[:-1]])
        for lo, hi in zip(starts, np.r_[starts[1:], len(iface)]):
            self._add_one(int(iface[lo]), ts_ns[lo:hi])

    def _add_one(self, k: int, ts_ns: np.ndarray) -> None:
        before = self.last.get(k)
        d = np.diff(ts_ns) if before is None else np.diff(ts_ns, prepend=np.int64(before))
        self.last[k] = int(ts_ns[-1])
        nonzero = d[d != 0]
        seen, stride = self.count.get(k, 0), self.stride.get(k, 1)
        self.count[k] = seen + len(nonzero)
        # positions seen, seen + 1, ...: the multiples of stride (a copy: a view would keep the chunk's array)
        taken = nonzero[(-seen) % stride::stride].copy()
        self.kept.setdefault(k, []).append(taken)
        self.kept_len[k] = self.kept_len.get(k, 0) + len(taken)
        while self.kept_len[k] > 2 * SAMPLE_DIFFERENCES:  # position 0 is always kept: [::2] keeps 2 x stride's
            halved = np.concatenate(self.kept[k])[::2].copy()
            self.kept[k], self.kept_len[k], stride = [halved], len(halved), stride * 2
        self.stride[k] = stride

    def resolution(self, ifaces: np.ndarray, declared: np.ndarray, *, min_differences: int = MIN_DIFFERENCES,
                   min_share: float = MIN_ON_TICK_SHARE) -> dict[str, np.ndarray]:
        """Per interface (``ifaces``: their indices, ``declared``: their declared ns per tick), the
        interfaces-frame columns ``effective_resolution_ns`` (the coarser of the declared resolution
        and the tick inferred from the sampled differences; the declared one when there are too few)
        and ``effective_resolution_samples`` (the interface's nonzero differences)."""
        ids = np.asarray(ifaces)
        effective = np.asarray(declared, dtype=np.float64).copy()
        samples = np.zeros(len(ids), np.int64)
        for j, k in enumerate(ids.tolist()):
            samples[j] = self.count.get(k, 0)
            if samples[j]:
                tick = infer_tick(np.concatenate(self.kept[k]), min_differences=min_differences, min_share=min_share)
                if tick is not None:
                    effective[j] = max(effective[j], float(tick))
        return {"effective_resolution_ns": effective, "effective_resolution_samples": samples}


def effective_resolution(packets: pl.DataFrame, ifaces: np.ndarray, declared: np.ndarray, *,
                         min_differences: int = MIN_DIFFERENCES,
                         min_share: float = MIN_ON_TICK_SHARE) -> dict[str, np.ndarray]:
    """:meth:`TickSampler.resolution` of these packets (``ts_ns``, ``iface``, ``parse_status``), taken at once."""
    sampler = TickSampler()
    if packets.height:
        sampler.add(packets["ts_ns"].to_numpy(), packets["iface"].to_numpy(), timed_packets(packets["parse_status"]))
    return sampler.resolution(ifaces, declared, min_differences=min_differences, min_share=min_share)


def timed_packets(status: pl.Series) -> np.ndarray:
    """Which rows of a ``parse_status`` column are packets with a time of their own (not ``not_packet``)."""
    if isinstance(status.dtype, pl.Enum):  # compare the codes: a string comparison costs 10x more
        cats = status.dtype.categories.to_list()
        not_packet = cats.index(NOT_PACKET) if NOT_PACKET in cats else -1
        return status.to_physical().to_numpy() != not_packet
    return (status != NOT_PACKET).fill_null(True).to_numpy()


__all__ = ["infer_tick", "effective_resolution", "TickSampler", "timed_packets", "capture_tick", "is_limited",
           "limited_text",
           "APPROXIMATE_TICKS", "MIN_DIFFERENCES", "MIN_ON_TICK_SHARE", "MAX_TICK_NS", "SAMPLE_DIFFERENCES"]
