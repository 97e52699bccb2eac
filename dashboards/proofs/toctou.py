"""The TOCTOU proof: each client's check → use windows on the resource, and the other clients'
changes that fall inside them.

:func:`toctou_frames` cuts the operations on the finding's resource and works out their roles (pure
Polars and a loop over the few operations around the window), :func:`toctou_chart` draws them,
:func:`toctou_proof` (registered for ``toctou``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.toctou as detector

from ..charts.base import (TIME_TITLE, empty, finish, opening_view as _view, seconds_domain as _domain, thin,
                           window_rect)
from ..frames import common_transactions, endpoint_matches, transactions_frame_of
from .base import Proof, finding_window, proof_chart

# Operations that read state (the "check" of a check-then-act) and that change it, per protocol's
# operation names (LDAP: RFC 4511 protocolOp; SMB2: MS-SMB2 2.2.1.2 commands; DNS: RFC 2136 UPDATE).
CHECK_OPS = {"searchRequest", "compareRequest", "CREATE", "QUERY_INFO", "READ", "QUERY_DIRECTORY"}
WRITE_OPS = {"modifyRequest", "addRequest", "delRequest", "modDNRequest", "WRITE", "SET_INFO", "UPDATE"}
# CREATE dispositions that replace or create the file (MS-SMB2 2.2.13 CreateDisposition): a write.
WRITING_DISPOSITIONS = {"SUPERSEDE", "CREATE", "OVERWRITE", "OVERWRITE_IF"}


# -- the evidence: operations on the resource, their roles, the windows -------------------------------

def _on_resource(frame: pl.DataFrame, resource: str | None) -> pl.Expr:
    if not resource:
        return pl.lit(True)
    cond = pl.col("resource") == resource
    if "target_name" in frame.columns:  # SMB2 rename / link onto the resource (MS-FSCC 2.4.37.2)
        base = resource.replace("/", "\\").rsplit("\\", 1)[-1]
        cond = cond | (pl.col("target_name") == base) | (pl.col("target_name") == resource)
    return cond.fill_null(False)


def toctou_frames(tx: pl.DataFrame, finding: dict, pad_ns: int | None = None) -> dict:
    """Operations on the finding's resource around its window, each given a role, and each client's
    check → use windows. A write that follows the same client's check closes that client's window
    (``use``, from the last check before it); a write that does not is a ``change``; a write inside
    *another* client's window is ``interleaved``, and so is that window. Roles are worked out over a
    wider stretch (ten times the padding) than is returned, so a window that began before the
    returned range still counts. Returns ``ops``, ``windows`` and ``domain_ns`` (the range drawn)."""
    start, end = finding_window(finding)
    pad = pad_ns if pad_ns is not None else max(end - start, 200_000_000)
    lo, hi = start - pad, end + pad
    t = tx.filter(_on_resource(tx, finding.get("resource"))
                  & endpoint_matches("server", "server_port", finding.get("server"))
                  & pl.col("request_ts_ns").is_between(start - 10 * pad, end + 10 * pad))
    writes = pl.col("operation").is_in(list(WRITE_OPS))
    if "create_disposition" in t.columns:
        writes = writes | ((pl.col("operation") == "CREATE")
                           & pl.col("create_disposition").cast(pl.String).is_in(list(WRITING_DISPOSITIONS)))
    ops = t.sort("request_ts_ns").select(
        pl.col("request_ts_ns").alias("t_ns"), pl.col("client").cast(pl.String), "operation",
        pl.col("request_frame").alias("frame"),
        pl.when(writes).then(pl.lit("write")).when(pl.col("operation").is_in(list(CHECK_OPS))).then(pl.lit("check"))
        .otherwise(pl.lit("other")).alias("kind"))
    rows = ops.to_dicts()
    last_check: dict[str, dict] = {}
    windows = []
    for r in rows:
        if r["kind"] == "check":
            last_check[r["client"]] = r
            r["role"] = "check"
        elif r["kind"] == "write":
            chk = last_check.pop(r["client"], None)
            r["role"] = "use" if chk else "change"
            if chk:
                windows.append({"client": r["client"], "check_ns": chk["t_ns"], "use_ns": r["t_ns"],
                                "check_frame": chk["frame"], "use_frame": r["frame"]})
        else:
            r["role"] = "other"
    writes_at = [(r["t_ns"], r["client"]) for r in rows if r["kind"] == "write"]
    for w in windows:
        w["interleaved"] = any(c != w["client"] and w["check_ns"] < t < w["use_ns"] for t, c in writes_at)
    for r in rows:
        r["interleaved"] = r["kind"] == "write" and any(
            w["client"] != r["client"] and w["check_ns"] < r["t_ns"] < w["use_ns"] for w in windows)
    ops_schema = {"t_ns": pl.Int64, "client": pl.String, "operation": pl.String, "frame": pl.UInt32,
                  "role": pl.String, "interleaved": pl.Boolean}
    win_schema = {"client": pl.String, "check_ns": pl.Int64, "use_ns": pl.Int64, "check_frame": pl.UInt32,
                  "use_frame": pl.UInt32, "interleaved": pl.Boolean}
    ops_out = pl.DataFrame([{k: r[k] for k in ops_schema} for r in rows], schema=ops_schema)
    win_out = pl.DataFrame(windows, schema=win_schema)
    return {"ops": ops_out.filter(pl.col("t_ns").is_between(lo, hi)),
            "windows": win_out.filter((pl.col("use_ns") >= lo) & (pl.col("check_ns") <= hi)),
            "domain_ns": (lo, hi)}


def resource_transactions(p: Proof) -> pl.DataFrame:
    """Transactions with their protocol-specific columns (create_disposition, target_name) when the
    finding's resource belongs to one protocol; else the common columns of all."""
    common = p.transactions()
    protocols = common.filter(_on_resource(common, p.finding.get("resource")))["protocol"].unique().to_list()
    name = transactions_frame_of(protocols[0]) if len(protocols) == 1 else None
    if name and p.has(name):
        full = p.cap.frame(name)
        extra = [c for c in ("create_disposition", "target_name") if c in full.columns]
        return common_transactions(full).with_columns(full.select(extra))
    return common


# -- the chart -----------------------------------------------------------------------------------------

ROLE_COLOURS = {"check": "#4e79a7", "use": "#59a14f", "change": "#e15759", "other": "#9e9e9e"}


def toctou_chart(ops: pl.DataFrame, windows: pl.DataFrame, *, t0_ns: int,
                 window_ns: tuple[int, int] | None = None, resource: str | None = None,
                 domain_ns: tuple[int, int] | None = None, view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """A Gantt of each client's check → use windows on the resource; the other clients' changes that
    fall inside a window are marked (red rule, labelled with what and who).

    ``ops``: ``t_ns``, ``client``, ``operation``, ``role`` (check, use, change, other), ``frame``,
    ``interleaved`` (a write inside another client's window). ``windows``: ``client``, ``check_ns``,
    ``use_ns``, ``check_frame``, ``use_frame``, ``interleaved`` (another client wrote inside it).
    ``domain_ns``: the time range the operations were cut to (default: the operations'); the chart
    opens on ``view_ns`` (default: the finding's window with context, else ``domain_ns``).
    """
    title = f"Check → use windows on {resource}" if resource else "Check → use windows"
    if ops.height == 0:
        return empty("No operations on this resource.", title)
    notes = []
    ops, note = thin(ops, max_rows=1500, keep=pl.col("interleaved"), what="operations")
    notes.append(note)
    windows, note = thin(windows, max_rows=1000, keep=pl.col("interleaved"), what="windows")
    notes.append(note)
    lo, hi = domain_ns or (int(ops["t_ns"].min()), int(ops["t_ns"].max()))
    pad = max((hi - lo) // 40, 1_000)
    view = _view(window_ns, view_ns, notes) or (lo - pad, hi + pad)
    domain = _domain(view[0], view[1], t0_ns)
    clients = ops.group_by("client").agg(pl.col("t_ns").min()).sort("t_ns")["client"].to_list()
    y = alt.Y("client:N", sort=clients, title=None, axis=alt.Axis(labelLimit=200))
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    layers = []
    if window_ns:
        layers.append(window_rect(*_domain(window_ns[0], window_ns[1], t0_ns), "", opacity=0.06, scale=xscale))
    if windows.height:
        w = windows.select("client", "check_frame", "use_frame",
                           ((pl.col("check_ns") - t0_ns) / 1e9).alias("t_s"),
                           ((pl.col("use_ns") - t0_ns) / 1e9).alias("use_s"),
                           ((pl.col("use_ns") - pl.col("check_ns")) / 1e6).alias("window_ms"),
                           pl.when(pl.col("interleaved")).then(pl.lit("changed underneath"))
                           .otherwise(pl.lit("clean")).alias("window"))
        layers.append(alt.Chart(w).mark_bar(height=16, opacity=0.5, clip=True).encode(
            x=x, x2="use_s:Q", y=y,
            fill=alt.Fill("window:N", scale=alt.Scale(domain=["clean", "changed underneath"],
                                                      range=["#bab0ac", "#e15759"]), title="check → use window",
                          legend=alt.Legend(orient="top")),
            tooltip=[alt.Tooltip("client:N"), alt.Tooltip("window:N"), alt.Tooltip("window_ms:Q", format=".3f"),
                     alt.Tooltip("check_frame:Q"), alt.Tooltip("use_frame:Q")]))
    o = ops.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"))
    changes = o.filter(pl.col("interleaved"))
    if changes.height:
        # one label per other client's burst of writes (writes closer than 1/60 of the range merge)
        gap_s = (domain[1] - domain[0]) / 60
        labels = (changes.sort("t_s").with_columns(
            (pl.col("t_s").diff().over("client").fill_null(gap_s + 1) > gap_s).cum_sum().over("client").alias("burst"))
            .group_by("client", "burst", maintain_order=True)  # the same spec on every run
            .agg(pl.col("t_s").min(), pl.col("operation").unique(maintain_order=True))
            .with_columns(pl.format("{} by {}", pl.col("operation").list.join(", "), pl.col("client")).alias("label")))
        rules = alt.Chart(changes.with_columns(pl.format("{} by {}", "operation", "client").alias("label")))
        layers.append(rules.mark_rule(color="#e15759", strokeWidth=1.5, strokeDash=[3, 2], clip=True).encode(
            x=x, tooltip=[alt.Tooltip("label:N", title="interleaved change"), alt.Tooltip("frame:Q")]))
        layers.append(alt.Chart(labels).mark_text(align="left", baseline="top", dx=3, dy=2, fontSize=11,
                                                  color="#c0392b", clip=True).encode(x=x, y=alt.value(0),
                                                                                     text="label:N"))
    layers.append(alt.Chart(o).mark_point(filled=True, size=60, stroke="#333", strokeWidth=0.5, clip=True).encode(
        x=x, y=y,
        color=alt.Color("role:N", scale=alt.Scale(domain=list(ROLE_COLOURS), range=list(ROLE_COLOURS.values())),
                        title="operation", legend=alt.Legend(orient="top")),
        shape=alt.Shape("role:N", scale=alt.Scale(domain=list(ROLE_COLOURS),
                                                  range=["circle", "square", "cross", "triangle"]), title="operation",
                        legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("client:N"), alt.Tooltip("operation:N"), alt.Tooltip("role:N"),
                 alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("frame:Q")]))
    chart = alt.layer(*layers).properties(width="container", height=alt.Step(44))
    return finish(chart.interactive(bind_y=False), title, notes)


@proof_chart(detector.NAME)
def toctou_proof(p: Proof) -> list[tuple[object, str]]:
    f = toctou_frames(resource_transactions(p), p.finding, pad_ns=max(p.window[0] - p.lo, p.hi - p.window[1], 0))
    return [(toctou_chart(f["ops"], f["windows"], t0_ns=p.t0, window_ns=p.window, resource=p.finding.get("resource"),
                          domain_ns=f["domain_ns"], view_ns=p.view),
             "Bars: each client's check → use window; red: another client's change inside it.")]
