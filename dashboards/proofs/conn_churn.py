"""The connection churn's proof: new connections per second per client, and each connection's
lifetime split into handshake, bind / session setup, work and close.

:func:`churn_frames` cuts the connections to the finding's server and their phases from the capture
(pure Polars), :func:`churn_rate_chart` and :func:`lifetime_chart` draw them, :func:`conn_churn_proof`
(registered for ``conn_churn``) ties them together.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

import detectors.conn_churn as detector
from analyzer.durations import fmt_ns

from ..charts.base import (TIME_TITLE, data_range, empty, finish, opening_view as _view, seconds_domain as _domain,
                           thin, window_rect, x_scale as _x_scale)
from ..frames import endpoint_matches
from .base import Proof, proof_chart

# Operations that set a connection up before it does its work (LDAP bind, SMB2 negotiate/session/tree,
# Kerberos AP exchanges are not on the connection) and that close it.
SETUP_OPS = {"bindRequest", "NEGOTIATE", "SESSION_SETUP", "TREE_CONNECT", "extendedRequest"}
CLOSE_OPS = {"unbindRequest", "LOGOFF", "TREE_DISCONNECT"}


# -- the evidence: connections and their phases --------------------------------------------------------

def churn_frames(connections: pl.DataFrame, tx: pl.DataFrame, finding: dict) -> dict:
    """Connections to the finding's server (``conns``: start_ns, client) and each one's lifetime split
    into handshake (SYN → handshake ACK), bind / session setup (until the last setup operation's
    response), work (until the last other response) and close (until the last packet)."""
    c = connections.filter(endpoint_matches("server", "server_port", finding.get("server")))
    client = finding.get("client")
    if client and c.filter(endpoint_matches("client", "client_port", client)).height:
        mine = c.filter(endpoint_matches("client", "client_port", client))
    else:
        mine = c
    conns = c.select(pl.col("first_ts_ns").alias("start_ns"), pl.col("client").cast(pl.String))
    on_tcp = tx.filter(pl.col("transport") == "tcp")
    per_conn = on_tcp.group_by("flow").agg(
        pl.col("response_ts_ns").filter(pl.col("operation").is_in(list(SETUP_OPS))).max().alias("setup_end"),
        pl.coalesce(pl.col("response_ts_ns"), pl.col("request_ts_ns"))
        .filter(~pl.col("operation").is_in(list(SETUP_OPS | CLOSE_OPS))).max().alias("work_end"))
    lt = (mine.join(per_conn, left_on="conn", right_on="flow", how="left")
          .with_columns(pl.coalesce(pl.col("syn_ts_ns"), pl.col("first_ts_ns")).alias("t_syn"))
          .with_columns((pl.col("t_syn") + pl.col("handshake_rtt_ns").fill_null(0)).alias("t_est"))
          .with_columns(pl.max_horizontal("t_est", pl.col("setup_end").fill_null(pl.col("t_est"))).alias("t_setup"))
          .with_columns(pl.max_horizontal("t_setup", pl.col("work_end").fill_null(pl.col("t_setup"))).alias("t_work"))
          .with_columns(pl.max_horizontal("t_work", "last_ts_ns").alias("t_end")))
    lifetimes = lt.select(
        "conn", pl.col("client").cast(pl.String), pl.col("first_ts_ns").alias("start_ns"),
        (pl.col("t_est") - pl.col("t_syn")).alias("handshake_ns"),
        (pl.col("t_setup") - pl.col("t_est")).alias("setup_ns"),
        (pl.col("t_work") - pl.col("t_setup")).alias("work_ns"), (pl.col("t_end") - pl.col("t_work")).alias("close_ns"))
    return {"conns": conns, "lifetimes": lifetimes}


# -- the charts ----------------------------------------------------------------------------------------

PHASES = ("handshake", "bind / session setup", "work", "close")
PHASE_COLOURS = ("#e8a202", "#e15759", "#4e79a7", "#bab0ac")


def churn_rate_chart(conns: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                     max_clients: int = 8, focus_client: str | None = None,
                     view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """New connections per second per client (1 s bins; 100 ms bins scaled to /s for views under
    10 s). ``conns``: ``start_ns``, ``client``. The busiest ``max_clients`` are drawn, and
    ``focus_client`` (the finding's) always. Opens on ``view_ns`` (default: the finding's window
    with context); scroll to zoom out."""
    title = "New connections per second"
    if conns.height == 0:
        return empty("No connections.", title)
    notes = []
    view = _view(window_ns, view_ns, notes)
    per = conns.group_by("client").len().sort("len", descending=True)
    clients = per.head(max_clients)["client"].to_list()
    if focus_client and focus_client not in clients and focus_client in per["client"].to_list():
        clients = clients[: max_clients - 1] + [focus_client]
    if per.height > len(clients):
        notes.append(f"the {len(clients)} busiest of {per.height:,} clients shown (this finding's included)")
        conns = conns.filter(pl.col("client").is_in(clients))
    lo, hi = int(conns["start_ns"].min()), int(conns["start_ns"].max())
    if window_ns:
        lo, hi = min(lo, window_ns[0]), max(hi, window_ns[1])
    n_total, total_s = conns.height, max((hi - lo) / 1e9, 1e-9)
    if view:
        lo, hi = data_range(view, (lo, hi))
        conns = conns.filter(pl.col("start_ns").is_between(lo, hi))
    span = (view[1] - view[0]) if view else hi - lo
    bin_ns = 1_000_000_000 if span >= 10_000_000_000 else 100_000_000
    nb = int((hi - lo) // bin_ns) + 1
    grid = pl.DataFrame({"client": clients}).join(pl.DataFrame({"bin": np.arange(nb, dtype=np.int64)}), how="cross")
    binned = conns.with_columns(((pl.col("start_ns") - lo) // bin_ns).alias("bin")).group_by("client", "bin").len("n")
    rate = (grid.join(binned, on=["client", "bin"], how="left").fill_null(0)
            .with_columns(((lo - t0_ns + pl.col("bin") * bin_ns) / 1e9).alias("t_s"),
                          (pl.col("n") / (bin_ns / 1e9)).alias("per_s")))
    rate, note = thin(rate, what="rate points")
    notes.append(note)
    xscale = _x_scale(view, t0_ns)
    layers = []
    if window_ns:
        layers.append(window_rect(*_domain(window_ns[0], window_ns[1], t0_ns), "churn window", opacity=0.08,
                                  scale=xscale))
    layers.append(alt.Chart(rate).mark_line(interpolate="step-after", point=alt.OverlayMarkDef(size=10, clip=True),
                                            clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("per_s:Q", title=f"new connections/s ({fmt_ns(bin_ns)} bins)"),
        color=alt.Color("client:N", sort=clients, title="client"),
        tooltip=[alt.Tooltip("client:N"), alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("n:Q", title="new"),
                 alt.Tooltip("per_s:Q", format=",.1f")]))
    chart = alt.layer(*layers).properties(width="container", height=220)
    return finish(chart.interactive(bind_y=False),
                  f"{title}: {n_total:,} connections, {n_total / total_s:,.1f}/s on average", notes)


def lifetime_chart(lifetimes: pl.DataFrame, *, max_bars: int = 300) -> alt.Chart:
    """Each connection's lifetime split into handshake, bind/session setup, work and close (stacked
    bars in ms, connections in start order); the title has the median share spent on setup.

    ``lifetimes``: ``conn``, ``client``, ``start_ns``, ``handshake_ns``, ``setup_ns``, ``work_ns``,
    ``close_ns`` (nulls count as 0)."""
    title = "Connection lifetime"
    if lifetimes.height == 0:
        return empty("No connections.", title)
    lt = lifetimes.sort("start_ns").with_columns(pl.col(c).fill_null(0).clip(lower_bound=0)
                                                 for c in ("handshake_ns", "setup_ns", "work_ns", "close_ns"))
    total = lt.select(pl.sum_horizontal("handshake_ns", "setup_ns", "work_ns", "close_ns").alias("t"),
                      (pl.col("handshake_ns") + pl.col("setup_ns")).alias("s"))
    share = total.filter(pl.col("t") > 0).select((pl.col("s") / pl.col("t")).median()).item()
    lt = lt.with_row_index("order")
    lt, note = thin(lt, max_rows=max_bars, what="connections")
    long = lt.unpivot(["handshake_ns", "setup_ns", "work_ns", "close_ns"], index=["order", "conn", "client"],
                      variable_name="phase", value_name="ns").with_columns(
        pl.col("phase").replace({"handshake_ns": PHASES[0], "setup_ns": PHASES[1], "work_ns": PHASES[2],
                                 "close_ns": PHASES[3]}),
        (pl.col("ns") / 1e6).alias("ms"))
    chart = alt.Chart(long).mark_bar().encode(
        x=alt.X("order:O", title="connections in start order", axis=alt.Axis(labels=lt.height <= 40, ticks=False)),
        y=alt.Y("ms:Q", title="ms", stack="zero"),
        color=alt.Color("phase:N", scale=alt.Scale(domain=list(PHASES), range=list(PHASE_COLOURS)), sort=list(PHASES),
                        title=None),
        order=alt.Order("phase_rank:Q"),
        tooltip=[alt.Tooltip("conn:Q", title="connection"), alt.Tooltip("client:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("ms:Q", format=".3f")],
    ).transform_calculate(phase_rank=f"indexof({list(PHASES)!r}, datum.phase)").properties(
        width="container", height=220)
    head = f"{title}: handshake + bind take {share * 100:.0f} % of it (median)" if share is not None else title
    return finish(chart, head, [note])


@proof_chart(detector.NAME)
def conn_churn_proof(p: Proof) -> list[tuple[object, str]]:
    f = churn_frames(p.cap.frame("connections"), p.transactions(), p.finding)
    return [(churn_rate_chart(f["conns"], t0_ns=p.t0, window_ns=p.window, focus_client=p.finding.get("client"),
                              view_ns=p.view),
             "New connections per second per client."),
            (lifetime_chart(f["lifetimes"]), "Each connection's lifetime: handshake and bind against work.")]
