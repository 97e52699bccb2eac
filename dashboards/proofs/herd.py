"""The herd's proof: request rate per key, the herd window, the TTL expiries the herd detector read,
and the server's latency on the same time axis.

:func:`herd_frames` cuts the evidence from the finding's protocol transactions (pure Polars),
:func:`herd_chart` draws it, :func:`herd_proof` (registered for ``herd``) ties them together.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

import detectors.herd as detector
from detectors.herd_files import FS_COLUMNS, parent_directory
from analyzer.durations import fmt_ns

from ..charts.base import (MAX_ROWS, PANEL_WIDTH, TIME_TITLE, data_range, empty, finish, focus_domain,
                           linked_zoom as _linked_zoom, nice_bin_ns, seconds_domain as _domain, thin, window_rect,
                           zoom_note)
from ..frames import common_transactions, endpoint_matches
from .base import Proof, detector_params, proof_chart

SECOND_NS = 1_000_000_000  # DNS TTLs are whole seconds (RFC 1035 3.2.1)
MAX_KEYS = 6
MAX_MARKERS = 200
HEIGHT = 220  # px, the rate panel
EXPIRY_COLOUR = "#6f4e9c"  # the TTL-expiry bands: apart from the herd window's red and the keys' colours


def _merge_intervals(starts: pl.Series, ends: pl.Series) -> pl.DataFrame:
    """Overlapping [start, end] intervals (ns) merged: ``start_ns``, ``end_ns``, ``n`` (how many)."""
    iv = pl.DataFrame({"s": starts.cast(pl.Int64), "e": ends.cast(pl.Int64)}).drop_nulls().sort("s")
    if iv.height == 0:
        return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "n": pl.UInt32})
    group = (pl.col("s") > pl.col("e").cum_max().shift(1)).fill_null(False).cum_sum()
    return (iv.with_columns(group.alias("g")).group_by("g", maintain_order=True)
            .agg(pl.col("s").min().alias("start_ns"), pl.col("e").max().alias("end_ns"),
                 pl.len().cast(pl.UInt32).alias("n"))
            .drop("g"))


def _step_changes(rate: pl.DataFrame, by: str, order: str, value: str) -> pl.DataFrame:
    """Rows of a step-after line where its value changes (and each series' first and last row):
    the same line, drawn from far fewer rows."""
    prev, nxt = pl.col(value).shift(1).over(by), pl.col(order).shift(-1).over(by)
    return rate.sort(by, order).filter(prev.is_null() | (pl.col(value) != prev) | nxt.is_null())


def herd_chart(requests: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int], focus_key: str | None,
               expiries_ns: pl.Series | list[int] | None = None, latency: pl.DataFrame | None = None,
               domain_ns: tuple[int, int] | None = None, view_ns: tuple[int, int] | None = None,
               expiry_window_ns: tuple[int, int] = (0, 0),
               max_keys: int = MAX_KEYS) -> alt.VConcatChart | alt.Chart:
    """Request rate per key over time with the herd window shaded and the TTL expiries marked;
    below, on the same time axis, the server's latency.

    ``requests``: ``t_ns``, ``key`` — one row per request. ``latency``: ``t_ns``, ``latency_ns``
    (and optionally ``key``) — one row per answered request. ``expiries_ns``: answer time + TTL of
    the cached answers; each is drawn as the band ``[e + expiry_window_ns[0], e + expiry_window_ns[1]]``
    (the herd detector's: TTLs are whole seconds, so a copy runs out within the second after answer +
    TTL, give or take its ``ttl_tolerance_ns``), overlapping bands merged. The chart opens on
    ``view_ns`` (default: the herd window with context, :func:`focus_domain`) and carries data for
    :func:`data_range` of it within ``domain_ns`` (the capture), so it zooms out; rates are counted in
    bins of about 1/300 of the view.
    """
    title = f"Herd on {focus_key}" if focus_key else "Herd"
    if requests.height == 0:
        return empty("No requests to draw for this finding.", title)
    extent = domain_ns or (int(requests["t_ns"].min()), int(requests["t_ns"].max()))
    view = view_ns or focus_domain(window_ns)
    wide = data_range(view, (min(extent[0], window_ns[0]), max(extent[1], window_ns[1])))
    bin_ns = nice_bin_ns(view[1] - view[0], 300)
    notes = [zoom_note(view, window_ns) if view_ns is None else None]
    counts = requests.group_by("key").len().sort(["len", "key"], descending=[True, False])
    keys = counts["key"].head(max_keys).to_list()
    if focus_key is not None and focus_key not in keys and focus_key in counts["key"].to_list():
        keys = keys[: max_keys - 1] + [focus_key]
    if counts.height > len(keys):
        notes.append(f"the {len(keys)} busiest of {counts.height:,} keys shown (this finding's included)")
    rate, lo, hi = None, *wide
    for lo_, hi_ in (wide, view):  # data beyond the view to zoom out into, unless that is too many rows
        nbins = int((hi_ - lo_) // bin_ns) + 1
        grid = pl.DataFrame({"key": keys}).join(pl.DataFrame({"bin": np.arange(nbins, dtype=np.int64)}), how="cross")
        binned = (requests.filter(pl.col("key").is_in(keys) & pl.col("t_ns").is_between(lo_, hi_))
                  .with_columns(((pl.col("t_ns") - lo_) // bin_ns).alias("bin"))
                  .group_by("key", "bin").len("requests"))
        rate = (grid.join(binned, on=["key", "bin"], how="left")
                .with_columns(pl.col("requests").fill_null(0).cast(pl.Int64),
                              ((lo_ - t0_ns + pl.col("bin") * bin_ns) / 1e9).alias("t_s")))
        rate = _step_changes(rate, "key", "bin", "requests")
        lo, hi = lo_, hi_
        if rate.height <= MAX_ROWS:
            break
    rate = rate.with_columns((pl.col("requests") / (bin_ns / 1e9)).alias("rate"),
                             (pl.col("key") == (focus_key or "")).alias("focus"))
    rate, rate_note = thin(rate, what="rate points")
    notes.append(rate_note)
    domain = _domain(view[0], view[1], t0_ns)
    zoom = _linked_zoom("herd_zoom")
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    w0, w1 = _domain(window_ns[0], window_ns[1], t0_ns)
    min_w = (domain[1] - domain[0]) / 300
    layers = [window_rect(w0, w1, f"herd window {fmt_ns(window_ns[1] - window_ns[0])}", scale=xscale,
                          min_width_s=min_w, opacity=0.3)]
    if expiries_ns is not None and len(expiries_ns):
        exp = pl.Series("e", expiries_ns, dtype=pl.Int64).drop_nulls()
        bands = _merge_intervals(exp + int(expiry_window_ns[0]), exp + max(int(expiry_window_ns[1]), 1))
        bands = bands.filter((pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi))
        if bands.height > MAX_MARKERS:
            notes.append(f"sampled: the {MAX_MARKERS} TTL-expiry windows with most answers of "
                         f"{bands.height:,} marked")
            bands = bands.sort("n", descending=True).head(MAX_MARKERS).sort("start_ns")
        if bands.height:
            marks = bands.with_columns(((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"),
                                       ((pl.col("end_ns") - t0_ns) / 1e9).alias("end_s"),
                                       pl.lit("TTL expiry").alias("label"))
            layers.append(alt.Chart(marks).mark_rect(color=EXPIRY_COLOUR, opacity=0.14, clip=True).encode(
                x=alt.X("start_s:Q", scale=xscale, title=TIME_TITLE), x2="end_s:Q",
                tooltip=[alt.Tooltip("label:N", title="what"), alt.Tooltip("start_s:Q", format=".6f"),
                         alt.Tooltip("end_s:Q", format=".6f"),
                         alt.Tooltip("n:Q", title="cached answers expiring")]))
            # labelled at its end (where the herd it triggers starts): its start is often left of the view
            layers.append(alt.Chart(marks).mark_text(align="right", baseline="bottom", dx=-3, dy=-3,
                                                     color=EXPIRY_COLOUR, fontSize=11, clip=True).encode(
                x=alt.X("end_s:Q", scale=xscale), y=alt.value(HEIGHT), text="label:N"))
    else:
        notes.append("no TTL-expiry instants to mark (no answer carried a TTL for this key)")
    layers.append(alt.Chart(rate).mark_line(interpolate="step-after", clip=True).encode(
        x=x, y=alt.Y("rate:Q", title=f"requests/s ({fmt_ns(bin_ns)} bins)"),
        color=alt.Color("key:N", title="key", sort=keys),
        strokeWidth=alt.condition("datum.focus", alt.value(2.2), alt.value(1.0)),
        tooltip=[alt.Tooltip("key:N"), alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("requests:Q"),
                 alt.Tooltip("rate:Q", format=",.1f")]).add_params(zoom))
    top = alt.layer(*layers).properties(width=PANEL_WIDTH, height=HEIGHT)
    if latency is None or latency.height == 0:
        return finish(top, title, notes)
    bottom, lat_note = _latency_panel(latency, t0_ns=t0_ns, lo=lo, hi=hi, bin_ns=bin_ns, x=x, xscale=xscale,
                                      window=(w0, w1), min_width_s=min_w)
    notes.append(lat_note)
    return finish(alt.vconcat(top, bottom, spacing=8).resolve_scale(x="shared"), title, notes)


def _latency_panel(latency, *, t0_ns, lo, hi, bin_ns, x, xscale, window, min_width_s):
    lat = latency.filter(pl.col("t_ns").is_between(lo, hi) & pl.col("latency_ns").is_not_null())
    y = alt.Y("latency_ms:Q", title="server latency (ms, log)", scale=alt.Scale(type="log"))
    shade = window_rect(window[0], window[1], "", scale=xscale, min_width_s=min_width_s, opacity=0.3)
    if lat.height <= MAX_ROWS:
        data = lat.select(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"),
                          (pl.col("latency_ns").clip(lower_bound=1) / 1e6).alias("latency_ms"))
        points = alt.Chart(data).mark_circle(size=18, opacity=0.7, color="#4e79a7", clip=True).encode(
            x=x, y=y, tooltip=[alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("latency_ms:Q", format=".4g")])
        return (shade + points).properties(width=PANEL_WIDTH, height=140), None
    stats = (lat.with_columns(((pl.col("t_ns") - lo) // bin_ns).alias("bin"))
             .group_by("bin").agg(pl.col("latency_ns").quantile(0.5, "nearest").alias("p50"),
                                  pl.col("latency_ns").max().alias("max"))
             .unpivot(["p50", "max"], index="bin", variable_name="stat", value_name="latency_ns")
             .with_columns(((lo - t0_ns + pl.col("bin") * bin_ns) / 1e9).alias("t_s"),
                           (pl.col("latency_ns").clip(lower_bound=1) / 1e6).alias("latency_ms"))
             .sort("stat", "bin"))
    lines = alt.Chart(stats).mark_line(clip=True).encode(x=x, y=y, strokeDash=alt.StrokeDash("stat:N", title="per bin"),
                                                tooltip=["stat:N", alt.Tooltip("latency_ms:Q", format=".4g")])
    note = f"aggregated: {lat.height:,} latencies → p50/max per {fmt_ns(bin_ns)} bin"
    return (shade + lines).properties(width=PANEL_WIDTH, height=140), note


# -- the evidence: requests, latency and TTL expiries of the finding's key -------------------------

def herd_key(tx: pl.DataFrame, focus: str | None) -> pl.Expr:
    """What a herd is keyed on: the transaction's resource, unless the finding's key is not a resource
    but a service: Kerberos herds are on the service a ticket is for (``sname@realm``; an AS-REQ's
    resource is the client principal)."""
    candidates = [pl.col("resource")]
    if {"sname", "realm"} <= set(tx.columns):
        candidates.append(pl.format("{}@{}", "sname", "realm"))
    if "sname" in tx.columns:
        candidates.append(pl.col("sname"))
    if focus and set(FS_COLUMNS) <= set(tx.columns):
        # a file-system herd (NFS) is keyed on the path and on its parent directory: a finding on a
        # directory counts the requests for the names in it as its own (detectors/herd.py fs_keyed)
        in_focus = (pl.col("resource") == focus) | (parent_directory(pl.col("resource")) == focus)
        return pl.when(in_focus.fill_null(False)).then(pl.lit(focus)).otherwise(pl.col("resource"))
    if focus:
        for key in candidates:
            if tx.select((key == focus).any()).item():
                return key
    return candidates[0]


def herd_frames(tx: pl.DataFrame, finding: dict, dns: pl.DataFrame | None = None) -> dict:
    """requests (t_ns, key) to the finding's server, latency (t_ns, latency_ns) of that server, the
    TTL expiries of the finding's key as the herd detector reads them (``expiries_ns``: response time
    + the answer's minimum TTL, the detector's ``ttl``), and ``expiry_window_ns``: the offsets around
    each within which the detector counts a re-query as triggered by it — TTLs are whole seconds, so
    a cached copy runs out within the second after answer + TTL, give or take the finding's
    ``ttl_tolerance_ns`` (``detectors/herd.py``, ``_ttl_trigger``). ``tx`` may carry protocol columns
    (see :func:`herd_key`)."""
    on_server = tx.filter(endpoint_matches("server", "server_port", finding.get("server")))
    on_server = on_server.with_columns(herd_key(on_server, finding.get("resource")).alias("key"))
    requests = on_server.filter(pl.col("key").is_not_null()).select(pl.col("request_ts_ns").alias("t_ns"), "key")
    latency = on_server.filter(pl.col("latency_ns").is_not_null() & (pl.col("key") == finding.get("resource"))
                               ).select(pl.col("request_ts_ns").alias("t_ns"), "latency_ns")
    if latency.height == 0:
        latency = on_server.filter(pl.col("latency_ns").is_not_null()).select(
            pl.col("request_ts_ns").alias("t_ns"), "latency_ns")
    expiries = None
    if dns is not None and dns.height and finding.get("resource"):
        mine = dns.filter((pl.col("resource") == finding["resource"])
                          & endpoint_matches("server", "server_port", finding.get("server"))
                          & pl.col("response_ts_ns").is_not_null())
        expiries = mine.select((pl.col("response_ts_ns") + pl.col("answer_ttl_min").cast(pl.Int64) * SECOND_NS)
                               .alias("e")).drop_nulls()["e"]
    tol = int(detector_params(finding, detector).ttl_tolerance_ns)
    return {"requests": requests, "latency": latency, "expiries_ns": expiries,
            "expiry_window_ns": (-tol, SECOND_NS + tol)}


@proof_chart(detector.NAME)
def herd_proof(p: Proof) -> list[tuple[object, str]]:
    finding = p.finding
    ptx = p.protocol_transactions(extra=("sname", "realm", *FS_COLUMNS))
    dns = common_transactions(p.cap.frame("dns_transactions")).with_columns(
        p.cap.frame("dns_transactions").select("answer_ttl_min", "negative_ttl")) \
        if (finding.get("kind") or "dns") == "dns" and p.has("dns_transactions") else None
    f = herd_frames(ptx, finding, dns)
    chart = herd_chart(f["requests"], t0_ns=p.t0, window_ns=p.window, focus_key=finding.get("resource"),
                       expiries_ns=f["expiries_ns"], expiry_window_ns=f["expiry_window_ns"],
                       latency=f["latency"], domain_ns=(p.t0, p.t1), view_ns=p.view)
    return [(chart, "Request rate per key; the herd window shaded red, the TTL expiries of the cached answers "
                    "as the detector reads them (answer + TTL, to the whole second, ± its tolerance) in "
                    "purple; the server's latency below on the same time axis (scroll to zoom both).")]
