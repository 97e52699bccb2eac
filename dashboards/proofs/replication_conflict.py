"""The replication conflict's proof: a ladder of the finding's entry across the providers — each client
write on its provider, each version (entryCSN) pushed from one provider to the other — with the lost
write marked.

:func:`replication_events` cuts the events of the finding's entry from ``ldap_sync`` (pure Polars) and
marks the writes the detector found lost (:func:`detectors.replication_conflict.conflicts`, the
detector's own decision), :func:`replication_chart` draws them, :func:`replication_conflict_proof`
(registered for ``replication_conflict``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.replication_conflict as detector
from detectors import replication_conflict_versions as rv

from ..charts.base import TIME_TITLE, empty, finish, opening_view as _view, seconds_domain as _domain, thin
from ..charts.base import focus_domain, window_rect, x_scale as _x_scale, zoom_note
from .base import Proof, detector_params, finding_window, proof_chart

LADDER_CONTEXT = 2.0  # the ladder opens on the finding's window ± this many times its length ...
LADDER_MIN_CONTEXT_NS = 5_000_000  # ... and at least 5 ms either side
EVENT_COLOURS = {"write": "#4e79a7", "lost write": "#e15759", "version pushed": "#59a14f",
                 "version read": "#bab0ac", "CNF object": "#f28e2b"}


def replication_events(sync: pl.DataFrame, finding: dict, lost_frames: set[int], pad_ns: int | None = None
                       ) -> pl.DataFrame:
    """The finding's entry (its DN, and the entryUUID seen with it) around the finding's window: client
    writes (lane: the provider written to; ``lost write`` for the frames the detector found lost),
    versions pushed (a segment from the sending provider's lane to the consumer's) and versions read."""
    start, end = finding_window(finding)
    pad = pad_ns if pad_ns is not None else max(end - start, 50_000_000)
    s = rv.entry_keys(sync)
    dn = finding.get("resource")
    keys = s.filter(rv.dn_key() == (dn or "").lower().replace(", ", ","))["key"].unique() if dn else None
    s = s.filter(pl.col("ts_ns").is_between(start - pad, end + pad))
    if keys is not None and keys.len():
        s = s.filter(pl.col("key").is_in(keys.implode()))
    first_value = pl.col("values").list.first()
    what = (pl.when(pl.col("kind").is_in(["modify", "add", "delete", "moddn"]))
            .then(pl.when(pl.col("frame").is_in(list(lost_frames))).then(pl.lit("lost write")).otherwise(pl.lit("write")))
            .when(pl.col("conflict_guid").is_not_null()).then(pl.lit("CNF object"))
            .when(pl.col("kind") == "sync_state").then(pl.lit("version pushed"))
            .when(pl.col("kind") == "entry").then(pl.lit("version read"))
            .otherwise(None))
    ev = s.with_columns(what.alias("event")).filter(pl.col("event").is_not_null())
    return ev.select(
        "ts_ns", "frame", "event", pl.col("server").alias("lane"),
        pl.when(pl.col("event") == "version pushed").then(pl.col("client")).otherwise(pl.col("server")).alias("lane_to"),
        pl.col("client").alias("peer"), "dn", "entry_csn", "csn_sid",
        pl.col("attributes").list.join(",").alias("attrs"), first_value.alias("value")).sort("ts_ns", "frame")


def replication_chart(ev: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                      view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """The ladder: time across, one lane per provider; writes as points on the provider written to,
    pushed versions as segments from the sending provider to the consumer, labelled by CSN serverID."""
    title = "Writes and replicated versions of the entry"
    if ev.height == 0:
        return empty("No writes or replicated versions of this entry in the capture.", title)
    notes: list = []
    if view_ns is None and window_ns is not None:  # replication runs in ms: open on the window ± 2x its length
        view_ns = focus_domain(window_ns, factor=LADDER_CONTEXT, min_context_ns=LADDER_MIN_CONTEXT_NS)
        notes.append(zoom_note(view_ns, window_ns))
    view = _view(window_ns, view_ns, notes)
    ev, note = thin(ev, keep=pl.col("event") == "lost write", what="events")
    notes.append(note)
    data = ev.with_columns(((pl.col("ts_ns") - t0_ns) / 1e9).alias("t_s"),
                           pl.format("sid {}", pl.col("csn_sid")).alias("sid"))
    xscale = _x_scale(view, t0_ns)
    lanes = sorted(set(data["lane"].drop_nulls().to_list()) | set(data["lane_to"].drop_nulls().to_list()))
    y = alt.Y("lane:N", title="provider", sort=lanes)
    colour = alt.Color("event:N", title="event", scale=alt.Scale(domain=list(EVENT_COLOURS),
                                                                 range=list(EVENT_COLOURS.values())))
    tips = [alt.Tooltip("event:N"), alt.Tooltip("frame:Q"), alt.Tooltip("t_s:Q", format=".6f"),
            alt.Tooltip("peer:N", title="client / consumer"), alt.Tooltip("attrs:N"), alt.Tooltip("value:N"),
            alt.Tooltip("entry_csn:N")]
    layers = []
    if window_ns:
        layers.append(window_rect(*_domain(window_ns[0], window_ns[1], t0_ns), "conflict", opacity=0.08,
                                  scale=xscale))
    base = alt.Chart(data)
    layers.append(base.transform_filter(alt.datum.event == "version pushed").mark_rule(strokeWidth=2).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale), y=y, y2="lane_to:N", color=colour, tooltip=tips))
    layers.append(base.mark_point(filled=True, size=80).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale), y=y, color=colour, tooltip=tips,
        shape=alt.Shape("event:N", legend=None)))
    layers.append(base.transform_filter(alt.datum.event == "version pushed").mark_text(dy=-10, fontSize=10).encode(
        x=alt.X("t_s:Q", scale=xscale), y=y, text="sid:N"))
    chart = alt.layer(*layers).properties(width="container", height=60 + 50 * max(len(lanes), 1))
    return finish(chart.interactive(bind_y=False), f"{title}: {ev.height:,} events", notes)


@proof_chart(detector.NAME)
def replication_conflict_proof(p: Proof) -> list[tuple[object, str]]:
    if not p.has("ldap_sync"):
        return [(empty("This capture has no LDAP replication frame."), "")]
    sync = p.cap.frame("ldap_sync")
    lost = set()
    if p.finding.get("kind") in ("lost_update", "probable_lost_update"):
        c = detector.conflicts(p.cap, detector_params(p.finding, detector))
        if c.height:
            lost = {int(f) for f in c["request_frame"].drop_nulls().to_list()}
    ev = replication_events(sync, p.finding, lost)
    chart = replication_chart(ev, t0_ns=p.t0, window_ns=p.window, view_ns=p.view)
    return [(chart, "One lane per provider: each client write (a point on the provider written to; red: the write "
                    "whose value was lost) and each version of the entry pushed by syncrepl (a segment from the "
                    "sending provider to the consumer, labelled with its CSN's serverID). A conflict is a write "
                    "sent before the other provider's version reached its provider.")]
