"""The detector contract and what every detector shares.

A detector is a module in ``detectors/`` with:

- ``NAME``: its dotted name (``herd``, ``retry_storm``, ``tcp_stall`` ...), the ``detector`` column.
- a module docstring: the pathology, the signal measured, the references (RFC / spec sections), the
  known false positives, the severity rule.
- ``REQUIRES``: the capture frames it reads (``("dns_transactions", "connections")``).
- ``Params``: a frozen dataclass; every threshold and window is a field with a default and a comment
  (``--set herd.min_clients=50`` and ``herdscope.toml`` override them by name).
- ``detect(capture, params) -> pl.DataFrame``: pure; returns findings (``FINDING_COLUMNS``) built with
  :func:`findings`, never raises on odd input (an empty frame means "nothing to report").

Three facts of real captures every detector respects (helpers below):
- **A client is not always an address** (processes on one node, NAT, containers, loopback): where one
  address runs independent request streams concurrently from several ports or connections, those are
  distinct clients. :func:`client_identity` decides per capture and says which way was used.
- **One vantage point**: a capture may miss a direction; :func:`directions_seen` tells, and a detector
  that cannot judge reports ``informational`` with the reason instead of guessing.
- **Timestamp resolution**: :func:`resolution_ns` is the capture's tick; never claim a window
  shorter than it (:func:`at_least_resolution`) and say so when it limits a finding.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Iterable

import numpy as np
import polars as pl

SEVERITIES = ("informational", "low", "medium", "high", "critical")
SEVERITY = pl.Enum(list(SEVERITIES))
SEVERITY_RANK = {s: k for k, s in enumerate(SEVERITIES)}
EVIDENCE_CAP = 50  # evidence frame numbers kept per finding (evidence_total says how many there were)

# The findings frame: one row per finding.
FINDING_COLUMNS: dict[str, tuple[pl.DataType, str]] = {
    "detector": (pl.String, "detector NAME (herd, retry_storm, smb_break_queue, tcp_stall, toctou, conn_churn)"),
    "kind": (pl.String, "the detector's sub-classification (e.g. tcp_stall: rto, zero_window; herd: dns)"),
    "finding_id": (pl.String, "stable 16-hex-digit id: same capture, same parameters, same id"),
    "severity": (SEVERITY, "informational < low < medium < high < critical, by the detector's documented rule"),
    "start_ns": (pl.Int64, "when the pathology starts (ns since the Unix epoch)"),
    "end_ns": (pl.Int64, "when it ends"),
    "client": (pl.String, "the client (address, address:port or several), null when not one"),
    "server": (pl.String, "the server address (or address:port)"),
    "resource": (pl.String, "what it is about: DNS name, principal, DN, share/path, connection a:p-b:q"),
    "clients": (pl.UInt32, "distinct clients involved (see client_identity)"),
    "client_identity": (pl.String, "how clients were told apart: address, address+port or connection"),
    "metric": (pl.String, "what was measured (e.g. clients_in_window, retries_per_request, stall_ms)"),
    "value": (pl.Float64, "the measured value"),
    "threshold": (pl.Float64, "the threshold it was compared with"),
    "unit": (pl.String, "unit of value and threshold"),
    "evidence_frames": (pl.List(pl.UInt32), f"Wireshark frame numbers of the evidence, at most {EVIDENCE_CAP}"),
    "evidence_total": (pl.UInt32, "how many evidence frames there were before capping"),
    "explanation": (pl.String, "one sentence with the numbers and the likely cause"),
    "parameters": (pl.String, "the detector's parameters as JSON"),
}
FINDINGS_SCHEMA = pl.Schema({k: v[0] for k, v in FINDING_COLUMNS.items()})


def empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema=FINDINGS_SCHEMA)


def params_json(params) -> str:
    return json.dumps(dataclasses.asdict(params), sort_keys=True, default=str)


def _finding_id(parts: Iterable) -> str:
    return hashlib.blake2b("\x1f".join("" if p is None else str(p) for p in parts).encode(),
                           digest_size=8).hexdigest()


def findings(rows: pl.DataFrame, *, detector: str, params) -> pl.DataFrame:
    """Complete a frame of findings: casts to FINDING_COLUMNS, caps evidence, adds the stable id and
    the parameters. ``rows`` needs at least kind, severity, start_ns, end_ns, metric, value, threshold,
    unit, evidence_frames and explanation; missing optional columns become null."""
    if rows.height == 0:
        return empty_findings()
    out = rows.with_columns(pl.lit(detector).alias("detector"))
    for name, (dtype, _) in FINDING_COLUMNS.items():
        if name not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=dtype).alias(name))
    out = out.with_columns(
        pl.col("evidence_frames").list.unique().list.sort().alias("evidence_frames"),
    ).with_columns(
        pl.col("evidence_frames").list.len().cast(pl.UInt32).alias("evidence_total"),
        pl.col("evidence_frames").list.head(EVIDENCE_CAP).alias("evidence_frames"),
        pl.lit(params_json(params)).alias("parameters"),
    )
    ids = [_finding_id(r) for r in out.select("detector", "kind", "client", "server", "resource",
                                              "start_ns", "metric").iter_rows()]
    out = out.with_columns(pl.Series("finding_id", ids))
    return out.select(pl.col(n).cast(t) for n, t in FINDINGS_SCHEMA.items())


def severity_from_scale(value: pl.Expr, steps: tuple[float, float, float, float]) -> pl.Expr:
    """Severity by thresholds on an impact measure: below steps[0] informational, then low, medium,
    high, and critical at or above steps[3]."""
    return (pl.when(value >= steps[3]).then(pl.lit("critical"))
            .when(value >= steps[2]).then(pl.lit("high"))
            .when(value >= steps[1]).then(pl.lit("medium"))
            .when(value >= steps[0]).then(pl.lit("low"))
            .otherwise(pl.lit("informational")))


# -- capture facts ----------------------------------------------------------------------------------

def resolution_ns(capture) -> float:
    """The coarsest timestamp tick among the capture's interfaces, in ns (1000 for µs pcap)."""
    ifaces = capture.frame("interfaces")
    return float(ifaces["ts_resolution_ns"].max()) if ifaces.height else 1000.0


def at_least_resolution(window_ns: int, capture) -> tuple[int, bool]:
    """(window, limited): the window widened to the timestamp resolution when it is shorter."""
    res = resolution_ns(capture)
    return (int(max(window_ns, res)), window_ns < res)


def directions_seen(capture) -> pl.DataFrame:
    """Per TCP connection: whether both directions were captured (conn, client_packets, server_packets,
    both_directions)."""
    conns = capture.frame("connections")
    return conns.select("conn", "client_packets", "server_packets",
                        ((pl.col("client_packets") > 0) & (pl.col("server_packets") > 0)).alias("both_directions"))


def client_identity(requests: pl.DataFrame, *, addr: str = "client", port: str = "client_port",
                    start: str = "request_ts_ns", end: str = "response_ts_ns",
                    timeout_ns: int = 1_000_000_000) -> tuple[pl.Expr, str]:
    """How to tell clients apart in ``requests`` (one row per request), and the name of the rule.

    An address that has requests *outstanding at the same time* from different ports runs several
    independent request streams (processes on one node, NAT, containers): then clients are
    address+port. When every address's requests are sequential (each answered, or given up after
    ``timeout_ns``, before the next), a new port per request is one client's resolver habit, and
    clients are addresses.
    """
    if requests.height == 0:
        return pl.col(addr).cast(pl.String), "address"
    spans = requests.select(
        pl.col(addr).cast(pl.String).alias("a"), pl.col(port).alias("p"), pl.col(start).alias("s"),
        pl.coalesce(pl.col(end), pl.col(start) + timeout_ns).alias("e"),
    ).sort("a", "s")
    overlapping = spans.with_columns(
        pl.col("e").cum_max().shift(1).over("a").alias("prev_end"),
        pl.col("p").shift(1).over("a").alias("prev_port"),
    ).filter((pl.col("s") < pl.col("prev_end")) & (pl.col("p") != pl.col("prev_port")))
    if overlapping.height:
        return pl.format("{}:{}", pl.col(addr).cast(pl.String), pl.col(port)), "address+port"
    return pl.col(addr).cast(pl.String), "address"


def evidence(frames: pl.Expr) -> pl.Expr:
    """Aggregate frame numbers into the evidence list (use inside ``group_by().agg``)."""
    return frames.cast(pl.UInt32).unique().sort().alias("evidence_frames")


def fmt_ns(ns: float | int | None) -> str:
    """A duration for an explanation: 42 µs, 3.1 ms, 1.25 s."""
    if ns is None or (isinstance(ns, float) and np.isnan(ns)):
        return "n/a"
    ns = float(ns)
    if ns < 999.5:  # thresholds at the rounding point: 999,999 ns is "1 ms", not "1e+03 µs"
        return f"{ns:.0f} ns"
    if ns < 999_500:
        return f"{ns / 1e3:.3g} µs"
    if ns < 999_500_000:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


# -- shared by the transaction detectors (herd, retry_storm, ...) -----------------------------------

# The frames that start with analyzer.decoders.common.TRANSACTION_COMMON, one per protocol decoder.
TRANSACTION_FRAMES = ("dns_transactions", "kerberos_transactions", "ldap_transactions", "smb2_transactions")


def transaction_frames(capture, names: Iterable[str] = TRANSACTION_FRAMES) -> dict[str, pl.DataFrame]:
    """name -> frame for every transaction frame this capture has (a decoder that is not installed
    is skipped) and that is not empty."""
    out = {}
    for name in names:
        try:
            frame = capture.frame(name)
        except KeyError:
            continue
        if frame is not None and frame.height:
            out[name] = frame
    return out


def client_identity_by(requests: pl.DataFrame, by: list[str], *, addr: str = "client",
                       port: str = "client_port", start: str = "request_ts_ns", end: str = "response_ts_ns",
                       timeout_ns: int = 1_000_000_000, name: str = "client_id") -> pl.DataFrame:
    """The rule of :func:`client_identity`, decided per address within each group of ``by`` (e.g.
    per server), in one vectorised pass: ``requests`` with ``name`` (the client) and
    ``client_identity`` ("address+port" for an address that has requests outstanding at the same
    time from different ports, "address" otherwise) added, in the original row order.

    Per address rather than per capture, so that one forwarder, NAT gateway or multi-process host
    does not turn every stub resolver of the capture (a new port per query, one at a time) into
    many clients. ``end`` null means unanswered: outstanding for ``timeout_ns``; a request that
    expects no answer should be given ``end`` = ``start``."""
    if requests.height == 0:
        return requests.with_columns(pl.lit(None, pl.String).alias(name),
                                     pl.lit(None, pl.String).alias("client_identity"))
    # one integer per (group, address), and the overlap test on a narrow frame: sorting the
    # requests themselves (strings and all) would cost several times more
    work = requests.with_columns(pl.struct([pl.col(c) for c in by] + [pl.col(addr).cast(pl.String)]).hash()
                                 .alias("_ci_g"))
    narrow = work.select(pl.col("_ci_g").alias("g"), pl.col(start).alias("s"), pl.col(port).alias("p"),
                         pl.coalesce(pl.col(end), pl.col(start) + timeout_ns).alias("e")).sort("g", "s")
    same = pl.col("g") == pl.col("g").shift(1)
    split = narrow.filter(
        (same & (pl.col("s") < pl.col("e").cum_max().over("g").shift(1)) & (pl.col("p") != pl.col("p").shift(1)))
        .fill_null(False)).select(pl.col("g").unique())["g"]
    ids = work[addr].cast(pl.String).alias(name)
    if split.len() == 0:
        return work.drop("_ci_g").with_columns(ids, pl.lit("address").alias("client_identity"))
    mask = work["_ci_g"].is_in(split.implode())
    rows = mask.arg_true()  # address:port strings only where an address was split (few rows)
    picked = work.select(pl.col(addr).cast(pl.String).alias("a"), pl.col(port).alias("p"))[rows]
    ids = ids.scatter(rows, picked.select(pl.format("{}:{}", "a", "p")).to_series())
    return work.drop("_ci_g").with_columns(
        ids, pl.when(mask).then(pl.lit("address+port")).otherwise(pl.lit("address")).alias("client_identity"))

