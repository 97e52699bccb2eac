"""The frames behind each detector's proof chart, cut from the capture for one finding.

One ``*_frames`` function per detector: pure Polars over capture frames (no Streamlit), returning the
inputs of the matching builder in :mod:`dashboards.charts.proofs`. :func:`proof_charts` ties them
together for the Findings page: finding in, list of (chart, caption) out. The findings schema is
``detectors.base.FINDING_COLUMNS``; a finding arrives here as one row (a dict).

What the detectors report is not re-derived here: the charts show the traffic around the finding
(its window, its key, its connection) so a reader can see the pathology the detector measured.
"""
from __future__ import annotations

import json

import polars as pl

from analyzer.tcp.analysis import ANY_RETRANSMISSION

from . import charts
from .frames import all_transactions, common_transactions, endpoint_matches, time_origin

# Operations that read state (the "check" of a check-then-act) and that change it, per protocol's
# operation names (LDAP: RFC 4511 protocolOp; SMB2: MS-SMB2 2.2.1.2 commands; DNS: RFC 2136 UPDATE).
CHECK_OPS = {"searchRequest", "compareRequest", "CREATE", "QUERY_INFO", "READ", "QUERY_DIRECTORY"}
WRITE_OPS = {"modifyRequest", "addRequest", "delRequest", "modDNRequest", "WRITE", "SET_INFO", "UPDATE"}
# CREATE dispositions that replace or create the file (MS-SMB2 2.2.13 CreateDisposition): a write.
WRITING_DISPOSITIONS = {"SUPERSEDE", "CREATE", "OVERWRITE", "OVERWRITE_IF"}
# Operations that set a connection up before it does its work (LDAP bind, SMB2 negotiate/session/tree,
# Kerberos AP exchanges are not on the connection) and that close it.
SETUP_OPS = {"bindRequest", "NEGOTIATE", "SESSION_SETUP", "TREE_CONNECT", "extendedRequest"}
CLOSE_OPS = {"unbindRequest", "LOGOFF", "TREE_DISCONNECT"}
SECOND_NS = 1_000_000_000  # DNS TTLs are whole seconds (RFC 1035 3.2.1)


def _window(finding: dict) -> tuple[int, int]:
    s = int(finding["start_ns"])
    return s, max(int(finding["end_ns"] if finding["end_ns"] is not None else s), s)


def _tx_for(cap, finding: dict, tx: pl.DataFrame | None = None, extra: tuple[str, ...] = ()) -> pl.DataFrame:
    """The transactions of the finding's protocol (its ``kind`` when that names a protocol with a
    transactions frame, with the ``extra`` protocol columns it has), else every protocol's."""
    kind = (finding.get("kind") or "").lower()
    name = f"{kind}_transactions"
    if kind and name in cap.frame_names():
        try:
            full = cap.frame(name)
            return common_transactions(full).with_columns(full.select([c for c in extra if c in full.columns]))
        except Exception:  # noqa: BLE001 - fall back to every protocol's transactions
            pass
    return tx if tx is not None else all_transactions(cap)[0]


# -- herd ------------------------------------------------------------------------------------------

def herd_key(tx: pl.DataFrame, focus: str | None) -> pl.Expr:
    """What a herd is keyed on: the transaction's resource, unless the finding's key is not a resource
    but a service: Kerberos herds are on the service a ticket is for (``sname@realm``; an AS-REQ's
    resource is the client principal)."""
    candidates = [pl.col("resource")]
    if {"sname", "realm"} <= set(tx.columns):
        candidates.append(pl.format("{}@{}", "sname", "realm"))
    if "sname" in tx.columns:
        candidates.append(pl.col("sname"))
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
    tol = int(parameters_of(finding).get("ttl_tolerance_ns", _herd_default("ttl_tolerance_ns")))
    return {"requests": requests, "latency": latency, "expiries_ns": expiries,
            "expiry_window_ns": (-tol, SECOND_NS + tol)}


def _herd_default(name: str):
    from detectors.herd import Params

    return getattr(Params(), name)


# -- retry storm -------------------------------------------------------------------------------------

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


def transaction_attempts(tx: pl.DataFrame, finding: dict, give_up_ns: int = 30_000_000_000) -> pl.DataFrame:
    """Requests to the finding's server (and resource) as attempts: a request is a retry of the
    previous one by the same client for the same operation and resource when that one went unanswered
    or failed, less than ``give_up_ns`` earlier."""
    q = tx.filter(endpoint_matches("server", "server_port", finding.get("server")))
    if finding.get("resource"):
        q = q.filter(pl.col("resource") == finding["resource"])
    key = ["client", "operation", "resource"]
    q = q.sort("request_ts_ns").with_columns(
        (pl.col("answered").not_() | pl.col("is_error").fill_null(False)).shift(1).over(key).alias("prev_failed"),
        pl.col("request_ts_ns").diff().over(key).alias("gap"))
    starts = ~(pl.col("prev_failed").fill_null(False) & (pl.col("gap") < give_up_ns))
    return (q.with_columns(starts.cast(pl.Int32).cum_sum().over(key).alias("n"))
            .with_columns(pl.format("{} {} {} #{}", "client", "operation", "resource", "n").alias("chain"))
            .with_columns(pl.int_range(pl.len()).over("chain").alias("attempt"))
            .select(pl.col("request_ts_ns").alias("t_ns"), "client", "chain", "attempt",
                    pl.col("request_frame").alias("frame")))


# -- SMB2 break queue -------------------------------------------------------------------------------

def break_frames(breaks: pl.DataFrame, smb2_tx: pl.DataFrame | None, finding: dict) -> dict:
    """The oplock/lease breaks on the finding's resource, and the requests that waited on it
    (answered with an interim STATUS_PENDING first, CHANGE_NOTIFY excluded, or named as a break's
    blocked trigger)."""
    resource = finding.get("resource")
    b = breaks.filter(endpoint_matches("server", "server_port", finding.get("server")))
    if resource:
        on_path = pl.col("path") == resource
        if "lease_paths" in b.columns:
            on_path = on_path | pl.col("lease_paths").list.contains(resource).fill_null(False)
        b = b.filter(on_path.fill_null(False))
    b = b.select("frame", "ts_ns", "ack_ts_ns", pl.col("client").cast(pl.String), "path",
                 pl.col("kind").cast(pl.String), *[c for c in ("trigger_frame",) if c in b.columns])
    empty_waiters = pl.DataFrame(schema={"t_ns": pl.Int64, "end_ns": pl.Int64, "client": pl.String,
                                         "operation": pl.String, "frame": pl.UInt32})
    if smb2_tx is None or smb2_tx.height == 0:
        return {"breaks": b, "waiters": empty_waiters}
    t = smb2_tx.filter(endpoint_matches("server", "server_port", finding.get("server")))
    if resource and "path" in t.columns:
        t = t.filter(pl.col("path") == resource)
    pending = pl.col("pending_ns").is_not_null() if "pending_ns" in t.columns else pl.lit(False)
    if "pending_by_design" in t.columns:
        pending = pending & ~pl.col("pending_by_design").fill_null(False)
    triggered = pl.col("request_frame").is_in(b["trigger_frame"].drop_nulls().implode()) \
        if "trigger_frame" in b.columns else pl.lit(False)
    waiters = t.filter(pending | triggered).select(
        pl.col("request_ts_ns").alias("t_ns"), pl.col("response_ts_ns").alias("end_ns"),
        pl.col("client").cast(pl.String), "operation", pl.col("request_frame").alias("frame"))
    return {"breaks": b, "waiters": waiters}


# -- TCP stall -------------------------------------------------------------------------------------

def stall_connection(segments: pl.DataFrame, connections: pl.DataFrame, finding: dict) -> int | None:
    """The connection a tcp_stall finding is about: the one most of its evidence frames belong to,
    else the one its resource (``a:p-b:q``) names."""
    frames = finding.get("evidence_frames") or []
    if frames:
        hit = segments.filter(pl.col("frame").is_in(pl.Series(frames, dtype=pl.UInt32).implode()))
        if hit.height:
            return int(hit.group_by("conn").len().sort("len", descending=True)["conn"][0])
    resource = finding.get("resource") or ""
    ends = {e.strip() for e in resource.replace("–", "-").split("-") if e.strip()} if resource else set()
    if len(ends) == 2:
        c = connections.with_columns(
            pl.format("{}:{}", pl.col("client").cast(pl.String), "client_port").alias("a"),
            pl.format("{}:{}", pl.col("server").cast(pl.String), "server_port").alias("b"),
            pl.format("[{}]:{}", pl.col("client").cast(pl.String), "client_port").alias("a6"),
            pl.format("[{}]:{}", pl.col("server").cast(pl.String), "server_port").alias("b6"))
        hit = c.filter((pl.col("a").is_in(list(ends)) | pl.col("a6").is_in(list(ends)))
                       & (pl.col("b").is_in(list(ends)) | pl.col("b6").is_in(list(ends))))
        if hit.height:
            return int(hit["conn"][0])
    return None


def stall_frames(segments: pl.DataFrame, packets: pl.DataFrame, conn: int, stall_findings: pl.DataFrame) -> dict:
    """The connection's segments with their times, the data direction (the one that sent more
    payload bytes) as ``from_sender``, retransmissions flagged; and the stalls to shade."""
    seg = segments.filter(pl.col("conn") == conn).join(packets.select("frame", "ts_ns"), on="frame", how="left")
    by_dir = seg.group_by("from_client").agg(pl.col("seglen").sum())
    client_sends = dict(by_dir.iter_rows()).get(True, 0) >= dict(by_dir.iter_rows()).get(False, 0)
    seg = seg.select(
        pl.col("ts_ns").alias("t_ns"), "frame", (pl.col("from_client") == client_sends).alias("from_sender"),
        "seq_rel", "seglen", "ack_rel", "window_size", "bytes_in_flight",
        ((pl.col("analysis") & ANY_RETRANSMISSION) != 0).alias("retransmission")).sort("t_ns")
    stalls = stall_findings.select(
        "start_ns", "end_ns",
        pl.format("{} {} ms", pl.coalesce(pl.col("kind"), pl.lit("stall")),
                  ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).round(1)).alias("label"))
    return {"segments": seg, "stalls": stalls}


# -- TOCTOU ------------------------------------------------------------------------------------------

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
    start, end = _window(finding)
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


# -- connection churn --------------------------------------------------------------------------------

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


# -- the Findings page's entry point -----------------------------------------------------------------

def proof_charts(cap, finding: dict, findings: pl.DataFrame | None = None,
                 tx: pl.DataFrame | None = None, whole: bool = False) -> list[tuple[object, str]]:
    """The charts that prove ``finding`` (a findings row as a dict), each with a one-line caption.
    Each opens zoomed on the finding's window with context (``charts.base.focus_domain``; scroll to
    zoom out), or on the whole capture with ``whole``."""
    t0, t1 = time_origin(cap)
    window = _window(finding)
    view = (t0, t1) if whole else None
    lo, hi = (t0, t1) if whole else charts.base.data_range(charts.base.focus_domain(window), (t0, t1))
    detector = finding["detector"]
    names = cap.frame_names()
    if detector == "herd":
        ptx = _tx_for(cap, finding, tx, extra=("sname", "realm"))
        dns = common_transactions(cap.frame("dns_transactions")).with_columns(
            cap.frame("dns_transactions").select("answer_ttl_min", "negative_ttl")) \
            if (finding.get("kind") or "dns") == "dns" and "dns_transactions" in names else None
        f = herd_frames(ptx, finding, dns)
        chart = charts.herd_chart(f["requests"], t0_ns=t0, window_ns=window, focus_key=finding.get("resource"),
                                  expiries_ns=f["expiries_ns"], expiry_window_ns=f["expiry_window_ns"],
                                  latency=f["latency"], domain_ns=(t0, t1), view_ns=view)
        return [(chart, "Request rate per key; the herd window shaded red, the TTL expiries of the cached answers "
                        "as the detector reads them (answer + TTL, to the whole second, ± its tolerance) in "
                        "purple; the server's latency below on the same time axis (scroll to zoom both).")]
    if detector == "retry_storm":
        use_dns = (finding.get("kind") or "dns") == "dns" and "dns_messages" in names
        attempts = dns_attempts(cap.frame("dns_messages"), finding) if use_dns \
            else transaction_attempts(_tx_for(cap, finding, tx), finding)
        return [
            (charts.retry_ladder(attempts, t0_ns=t0, window_ns=window, view_ns=view),
             "One row per client, a mark per attempt."),
            (charts.retry_intervals(attempts), "Time between consecutive attempts of the same request."),
            (charts.amplification_chart(attempts, t0_ns=t0, window_ns=window, view_ns=view),
             "Attempts sent per second against the requests behind them."),
        ]
    if detector == "smb_break_queue":
        if "smb2_breaks" not in names:
            return [(charts.empty("This capture has no smb2_breaks frame (the SMB2 decoder is not installed)."), "")]
        smb2_tx = cap.frame("smb2_transactions") if "smb2_transactions" in names else None
        f = break_frames(cap.frame("smb2_breaks"), smb2_tx, finding)
        return [(charts.break_queue_chart(f["breaks"], f["waiters"], t0_ns=t0, window_ns=window, end_ns=t1,
                                          view_ns=view),
                 "Each break from notification to acknowledgment; below, how many requests queued behind it.")]
    if detector == "tcp_stall":
        segments, connections = cap.frame("tcp_segments"), cap.frame("connections")
        conn = stall_connection(segments, connections, finding)
        if conn is None:
            return [(charts.empty("The finding's connection is not in this capture's TCP analysis."), "")]
        same = (findings if findings is not None else pl.DataFrame([finding])).filter(
            (pl.col("detector") == "tcp_stall") & (pl.col("resource") == finding.get("resource")))
        if same.height == 0:
            same = pl.DataFrame([finding]).select("start_ns", "end_ns", "kind")
        f = stall_frames(segments, cap.packets, conn, same)
        title = f"Time-sequence graph of {finding.get('resource') or f'connection {conn}'}"
        return [(charts.stevens_chart(f["segments"], t0_ns=t0, stalls=f["stalls"], title=title, window_ns=window,
                                      view_ns=view),
                 "Sequence numbers sent, the ACK line and the receive window; retransmissions as red diamonds, "
                 "stalls shaded; bytes in flight below (drag to zoom both).")]
    if detector == "toctou":
        f = toctou_frames(_protocol_tx_full(cap, finding, tx), finding,
                          pad_ns=max(window[0] - lo, hi - window[1], 0))
        return [(charts.toctou_chart(f["ops"], f["windows"], t0_ns=t0, window_ns=window,
                                     resource=finding.get("resource"), domain_ns=f["domain_ns"], view_ns=view),
                 "Bars: each client's check → use window; red: another client's change inside it.")]
    if detector == "conn_churn":
        f = churn_frames(cap.frame("connections"), tx if tx is not None else all_transactions(cap)[0], finding)
        return [(charts.churn_rate_chart(f["conns"], t0_ns=t0, window_ns=window, focus_client=finding.get("client"),
                                         view_ns=view),
                 "New connections per second per client."),
                (charts.lifetime_chart(f["lifetimes"]), "Each connection's lifetime: handshake and bind against work.")]
    return [(charts.empty(f"No chart for detector {detector!r} yet: the explanation and evidence frames are "
                          f"below."), "")]


def _protocol_tx_full(cap, finding: dict, tx: pl.DataFrame | None) -> pl.DataFrame:
    """Transactions with their protocol-specific columns (create_disposition, target_name) when the
    finding's resource belongs to one protocol; else the common columns of all."""
    common = tx if tx is not None else all_transactions(cap)[0]
    protocols = common.filter(_on_resource(common, finding.get("resource")))["protocol"].unique().to_list()
    if len(protocols) == 1 and f"{protocols[0]}_transactions" in cap.frame_names():
        full = cap.frame(f"{protocols[0]}_transactions")
        extra = [c for c in ("create_disposition", "target_name") if c in full.columns]
        return common_transactions(full).with_columns(full.select(extra))
    return common


def parameters_of(finding: dict) -> dict:
    """The finding's parameters (stored as JSON text in the findings frame)."""
    raw = finding.get("parameters")
    if isinstance(raw, dict):
        return raw
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {"parameters": raw}
