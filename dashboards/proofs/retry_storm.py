"""The retry storm's proof: every client's attempts on a ladder, the intervals between retries with
their backoff class (the detector's own :func:`detectors.retry_storm.classify_backoff`), and the
amplification over time.

:func:`dns_attempts` / :func:`transaction_attempts` cut the attempts from the capture (pure Polars;
:func:`with_resends` adds the resends a protocol folds into its transactions, NFS's same-xid calls),
:func:`retry_ladder`, :func:`retry_intervals` and :func:`amplification_chart` draw them,
:func:`retry_storm_proof` (registered for ``retry_storm``) ties them together.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

import detectors.retry_storm as detector
from analyzer.durations import fmt_ns
from detectors.base import protocol_declaration
from detectors.retry_storm import classify_backoff
from detectors.retry_storm_sends import resends_of

from ..charts.base import (TIME_TITLE, data_range, empty, finish, nice_bin_ns, opening_view as _view,
                           seconds_domain as _domain, thin, window_rect, x_scale as _x_scale)
from ..frames import endpoint_matches
from .base import Proof, detector_params, proof_chart

MAX_CLIENTS = 60


# -- the evidence: attempts ----------------------------------------------------------------------------

def dns_attempts(dns_messages: pl.DataFrame, finding: dict) -> pl.DataFrame:
    """Every query to the finding's server for its name: one row per attempt, chained by Wireshark's
    retransmission rule (same client address/port, id and question: ``dns.retransmission``)."""
    q = dns_messages.filter(~pl.col("qr").fill_null(False)
                            & endpoint_matches("dst", "dport", finding.get("server")))
    if finding.get("resource"):
        q = q.filter(pl.col("qname") == finding["resource"])
    key = ["src", "sport", "id", "qname", "qtype"]
    return (q.sort("ts_first_ns")
            .with_columns((~pl.col("retransmission").fill_null(False)).cast(pl.Int32).cum_sum().over(key).alias("n"))
            .with_columns(pl.format("{}:{} #{} {} {}", pl.col("src").cast(pl.String), "sport", "id", "qname",
                                    "n").alias("chain"))
            .with_columns(pl.int_range(pl.len()).over("chain").alias("attempt"))
            .select(pl.col("ts_first_ns").alias("t_ns"), pl.col("src").cast(pl.String).alias("client"), "chain",
                    "attempt", pl.col("frame_first").alias("frame")))


def transaction_attempts(tx: pl.DataFrame, finding: dict, give_up_ns: int | None = None) -> pl.DataFrame:
    """Requests to the finding's server (and resource) as attempts: a request is a retry of the
    previous one by the same client for the same operation and resource when that one went unanswered
    or failed, at most ``give_up_ns`` earlier (default: the detector's ``max_gap_ns``); a row with
    ``same_id`` true (a resend its protocol recognises, :func:`with_resends`) whatever the gap."""
    give_up_ns = detector.Params().max_gap_ns if give_up_ns is None else give_up_ns
    q = tx.filter(endpoint_matches("server", "server_port", finding.get("server")))
    if finding.get("resource"):
        q = q.filter(pl.col("resource") == finding["resource"])
    if "same_id" not in q.columns:
        q = q.with_columns(pl.lit(False).alias("same_id"))
    key = ["client", "operation", "resource"]
    q = q.sort("request_ts_ns").with_columns(
        (pl.col("answered").not_() | pl.col("is_error").fill_null(False)).shift(1).over(key).alias("prev_failed"),
        pl.col("request_ts_ns").diff().over(key).alias("gap"))
    starts = ~((pl.col("prev_failed").fill_null(False) & (pl.col("gap") <= give_up_ns))
               | pl.col("same_id").fill_null(False))
    return (q.with_columns(starts.cast(pl.Int32).cum_sum().over(key).alias("n"))
            .with_columns(pl.format("{} {} {} #{}", "client", "operation", "resource", "n").alias("chain"))
            .with_columns(pl.int_range(pl.len()).over("chain").alias("attempt"))
            .select(pl.col("request_ts_ns").alias("t_ns"), "client", "chain", "attempt",
                    pl.col("request_frame").alias("frame")))


def with_resends(tx: pl.DataFrame, resends: pl.DataFrame) -> pl.DataFrame:
    """Transactions (common columns) plus one row per resend its protocol folded into them (the
    ``resends`` hook's rows: ``txn`` is the row of ``tx``), so each send is an attempt: a resend is
    a copy of its transaction at its own time and frame with ``same_id``, and only a transaction's
    last send carries its answer (the ones before it went unanswered)."""
    base = tx.with_row_index("_txn").with_columns(pl.col("_txn").cast(pl.Int64), pl.lit(False).alias("same_id"))
    if resends.height == 0:
        return base.drop("_txn")
    copies = base.join(resends.select(pl.col("txn").cast(pl.Int64).alias("_txn"), "ts", "frame"), on="_txn",
                       how="inner").with_columns(
        pl.col("ts").cast(base["request_ts_ns"].dtype).alias("request_ts_ns"),
        pl.col("frame").cast(base["request_frame"].dtype).alias("request_frame"),
        pl.lit(True).alias("same_id")).drop("ts", "frame")
    last = pl.col("request_ts_ns") == pl.col("request_ts_ns").max().over("_txn")
    return pl.concat([base, copies]).with_columns(
        (pl.col("answered") & last).alias("answered"),
        pl.when(last).then(pl.col("is_error")).alias("is_error")).drop("_txn")


def protocol_attempts(p: Proof, finding: dict, give_up_ns: int) -> pl.DataFrame:
    """The finding's protocol's attempts: its transactions, and the resends its ``Protocol.resends``
    hook finds in its message frame (the same sends the detector counted)."""
    tx = p.protocol_transactions()
    decl = protocol_declaration((finding.get("kind") or "").lower())
    name = decl.transactions if decl is not None else None
    if decl is not None and decl.resends and name and p.has(name) and p.has(decl.resends_frame):
        try:
            full = p.cap.frame(name)
            if full.height == tx.height:  # the same rows, in the same order: the hook's txn indexes tx
                tx = with_resends(tx, resends_of(decl, p.cap.frame(decl.resends_frame), full))
        except Exception:  # noqa: BLE001 - the chart falls back to the transactions alone
            pass
    return transaction_attempts(tx, finding, give_up_ns=give_up_ns)


# -- the charts ----------------------------------------------------------------------------------------

def backoff_of(attempts: pl.DataFrame, params: detector.Params | None = None) -> tuple[str, float | None, float | None]:
    """(backoff class, median interval ns, median ratio of consecutive intervals) of the retry chains
    in ``attempts`` (``chain``, ``t_ns``: one row per attempt).

    The class is the retry_storm detector's (:func:`detectors.retry_storm.classify_backoff` over each
    chain's intervals, with ``params``, the finding's): fixed, linear, exponential or irregular; where
    no chain has two intervals (the detector's "unknown") it is ``single retry``, without any interval
    ``no retries``. The ratio is what the chart's title shows, not what decides the class."""
    iv = (attempts.sort("chain", "t_ns")
          .with_columns(pl.col("t_ns").diff().over("chain").alias("interval_ns"))
          .filter(pl.col("interval_ns").is_not_null()))
    if iv.height == 0:
        return "no retries", None, None
    median_ns = float(iv["interval_ns"].median())
    chains = iv.sort("t_ns").group_by("chain", maintain_order=True).agg(pl.col("interval_ns").sort_by("t_ns"))
    kind, _ = classify_backoff([np.asarray(c, dtype=np.float64) for c in chains["interval_ns"].to_list()],
                               params if params is not None else detector.Params())
    ratios = (iv.with_columns((pl.col("interval_ns") / pl.col("interval_ns").shift(1).over("chain"))
                              .alias("ratio")).filter(pl.col("ratio").is_not_null() & pl.col("ratio").is_finite()))
    ratio = float(ratios["ratio"].median()) if ratios.height else None
    return ("single retry" if kind == "unknown" else kind), median_ns, ratio


def retry_ladder(attempts: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                 view_ns: tuple[int, int] | None = None, max_clients: int = MAX_CLIENTS) -> alt.Chart:
    """One row per client, a mark per attempt (first tries hollow, retries filled red). Opens on
    ``view_ns`` (default: the storm window with context); scroll to zoom out.

    ``attempts``: ``t_ns``, ``client``, ``chain``, ``attempt`` (0 = first try), ``frame``."""
    title = "Retry ladder"
    if attempts.height == 0:
        return empty("No attempts to draw.", title)
    notes = []
    view = _view(window_ns, view_ns, notes)
    xscale = _x_scale(view, t0_ns)
    per_client = attempts.group_by("client").agg(pl.len().alias("n"), pl.col("t_ns").min().alias("first"))
    if per_client.height > max_clients:
        keep = per_client.sort("n", descending=True).head(max_clients)
        notes.append(f"sampled: the {max_clients} clients with most attempts of {per_client.height:,} shown")
        attempts = attempts.filter(pl.col("client").is_in(keep["client"].implode()))
        per_client = keep
    order = per_client.sort("first")["client"].to_list()
    data = attempts.select(
        "client", "chain", "attempt", "frame", ((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"),
        pl.when(pl.col("attempt") == 0).then(pl.lit("first try")).otherwise(pl.lit("retry")).alias("what"))
    data, note = thin(data, keep=pl.col("attempt") == 1, what="attempts")
    notes.append(note)
    layers = []
    if window_ns:
        w0, w1 = _domain(window_ns[0], window_ns[1], t0_ns)
        layers.append(window_rect(w0, w1, "storm window", colour="#e15759", opacity=0.08, scale=xscale))
    layers.append(alt.Chart(data).mark_point(size=30, filled=True, clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("client:N", sort=order, title=None, axis=alt.Axis(labelLimit=200)),
        color=alt.Color("what:N", scale=alt.Scale(domain=["first try", "retry"], range=["#4e79a7", "#e15759"]),
                        title=None, legend=alt.Legend(orient="top")),
        shape=alt.Shape("what:N", scale=alt.Scale(domain=["first try", "retry"], range=["circle", "triangle-right"]),
                        title=None, legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("client:N"), alt.Tooltip("attempt:Q", title="attempt # (0 = first)"),
                 alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("frame:Q")]))
    # discrete y: a step per row (Streamlit does not honour a fixed height on a discrete axis)
    chart = alt.layer(*layers).properties(width="container", height=alt.Step(16 if len(order) > 8 else 24))
    return finish(chart.interactive(bind_y=False), title, notes)


def retry_intervals(attempts: pl.DataFrame, *, backoff: str | None = None, bins: int = 40,
                    params: detector.Params | None = None) -> alt.Chart:
    """Histogram of the time between consecutive attempts of one request, with the backoff class
    (:func:`backoff_of` with ``params``, the finding's; ``backoff`` overrides the label)."""
    kind, median_ns, ratio = backoff_of(attempts, params)
    label = backoff or kind
    title = f"Retry intervals — backoff: {label}"
    if median_ns is not None:
        title += f" (median {fmt_ns(median_ns)}" + (f", ×{ratio:.2f} per retry)" if ratio else ")")
    iv = (attempts.sort("chain", "t_ns").with_columns(pl.col("t_ns").diff().over("chain").alias("interval_ns"))
          .filter(pl.col("interval_ns").is_not_null()))
    if iv.height == 0:
        return empty("No retries: every request was sent once.", title)
    ms = iv["interval_ns"].to_numpy().astype(np.float64) / 1e6
    top = float(np.quantile(ms, 0.995)) * 1.05 or 1.0
    counts, edges = np.histogram(np.clip(ms, 0, top), bins=bins, range=(0, top))
    data = pl.DataFrame({"from_ms": edges[:-1], "to_ms": edges[1:], "intervals": counts})
    chart = alt.Chart(data).mark_bar(color="#e15759").encode(
        x=alt.X("from_ms:Q", title="interval between attempts (ms)"), x2="to_ms:Q",
        y=alt.Y("intervals:Q", title="intervals"), y2=alt.datum(0),
        tooltip=[alt.Tooltip("from_ms:Q", format=".4g"), alt.Tooltip("to_ms:Q", format=".4g"),
                 alt.Tooltip("intervals:Q")]).properties(width="container", height=200)
    clipped = int((ms > top).sum())
    notes = [f"aggregated: {len(ms):,} intervals in {bins} bins",
             f"{clipped} intervals above {top:.4g} ms counted in the last bin" if clipped else None]
    return finish(chart, title, notes)


def amplification_chart(attempts: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                        view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """Attempts/s against first tries/s over time; the subtitle has the overall amplification. Opens
    on ``view_ns`` (default: the storm window with context), bins of about 1/120 of it."""
    title = "Amplification over time"
    if attempts.height == 0:
        return empty("No attempts to draw.", title)
    notes = []
    view = _view(window_ns, view_ns, notes)
    total = attempts.height / max(int((attempts["attempt"] == 0).sum()), 1)
    lo, hi = int(attempts["t_ns"].min()), int(attempts["t_ns"].max())
    if view:
        lo, hi = data_range(view, (lo, hi))
        attempts = attempts.filter(pl.col("t_ns").is_between(lo, hi))
    bin_ns = nice_bin_ns((view[1] - view[0]) if view else hi - lo, 120, min_ns=1_000_000)
    per = (attempts.with_columns(((pl.col("t_ns") - lo) // bin_ns).alias("bin"))
           .group_by("bin").agg(pl.len().alias("all attempts"), (pl.col("attempt") == 0).sum().alias("first tries")))
    grid = pl.DataFrame({"bin": np.arange(int((hi - lo) // bin_ns) + 1, dtype=np.int64)})
    per = (grid.join(per, on="bin", how="left").fill_null(0)
           .with_columns(((lo - t0_ns + pl.col("bin") * bin_ns) / 1e9).alias("t_s"),
                         (pl.col("all attempts") / pl.max_horizontal(pl.col("first tries"), 1)).alias("amplification")))
    long = per.unpivot(["all attempts", "first tries"], index=["t_s", "amplification"], variable_name="what",
                       value_name="count").with_columns((pl.col("count") / (bin_ns / 1e9)).alias("per_s"))
    xscale = _x_scale(view, t0_ns)
    layers = []
    if window_ns:
        w0, w1 = _domain(window_ns[0], window_ns[1], t0_ns)
        layers.append(window_rect(w0, w1, "", opacity=0.08, scale=xscale))
    layers.append(alt.Chart(long).mark_line(interpolate="step-after", clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("per_s:Q", title=f"per second ({fmt_ns(bin_ns)} bins)"),
        color=alt.Color("what:N", scale=alt.Scale(domain=["all attempts", "first tries"], range=["#e15759", "#4e79a7"]),
                        title=None),
        tooltip=[alt.Tooltip("what:N"), alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("per_s:Q", format=",.1f"),
                 alt.Tooltip("amplification:Q", format=".2f", title="attempts per first try")]))
    chart = alt.layer(*layers).properties(width="container", height=200)
    return finish(chart.interactive(bind_y=False), f"{title}: {total:.2f} attempts per request overall", notes)


@proof_chart(detector.NAME)
def retry_storm_proof(p: Proof) -> list[tuple[object, str]]:
    finding = p.finding
    params = detector_params(finding, detector)
    if (finding.get("kind") or "dns") == "dns" and p.has("dns_messages"):
        attempts = dns_attempts(p.cap.frame("dns_messages"), finding)
    else:
        attempts = protocol_attempts(p, finding, params.max_gap_ns)
    return [
        (retry_ladder(attempts, t0_ns=p.t0, window_ns=p.window, view_ns=p.view),
         "One row per client, a mark per attempt."),
        (retry_intervals(attempts, params=params), "Time between consecutive attempts of the same request."),
        (amplification_chart(attempts, t0_ns=p.t0, window_ns=p.window, view_ns=p.view),
         "Attempts sent per second against the requests behind them."),
    ]
