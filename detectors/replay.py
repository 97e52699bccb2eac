"""Kerberos replay (``replay``): the same authenticator or the same KDC request sent again and again.

The pathology
    A Kerberos AP-REQ authenticates its sender once: its authenticator (client name, a timestamp with
    microseconds, optionally a sequence number and subkey) is encrypted in the ticket's session key,
    and the service keeps every authenticator it accepted in a *replay cache* for as long as a
    timestamp stays acceptable (RFC 4120 §3.2.3: "within the allowable clock skew", §10 and §3.1.5:
    customarily 5 minutes) and rejects a second copy with KRB_AP_ERR_REPEAT (34). A captured
    AP-REQ sent again — by an attacker, a broken proxy, a client library that resends its first GSS
    token — costs the service a decryption and a replay-cache lookup per copy; at µs RTTs a replayer
    can send hundreds of thousands a second, and the cache overflows or pins a CPU, while legitimate
    clients that retransmit fast trip it ("Request is a replay"). When the service keeps no replay
    cache (KRB5RCACHETYPE=none, some SPNEGO stacks) the replayed copies are *accepted*. The KDC has
    its own defence: MIT's and Heimdal's KDCs keep a *lookaside cache* of recent requests and answer a
    byte-identical request with the reply they sent before (MIT krb5kdc logs "repeated
    (retransmitted?) request ... resending previous response").

The signal (frames ``kerberos_ap``, ``kerberos_messages``, ``kerberos_transactions`` and the
carriers' transactions)
    * ``authenticator_replay``: AP-REQs inside GSS-API carriers (LDAP SASL binds, SMB2
      SESSION_SETUP, HTTP ``Authorization: Negotiate``: ``kerberos_ap`` rows, carrier not ``kdc``)
      keyed by MIT krb5 >= 1.18's replay-cache tag (``rc_tag``: the tail of the authenticator's
      ciphertext, ``k5_rc_tag_from_ciphertext`` in src/lib/krb5/rcache/rc_base.c), so a passive
      observer sees exactly the copies the service's cache sees, without keys. Per service (server
      address, ticket sname and realm): the copies after the first, in episodes that end when no
      copy came for ``window_ns`` (the replay cache's 5-minute horizon); their rate; the distinct
      clients that sent them (the address: a replayer opens a fresh connection per copy, so ports say
      nothing), how many came from an address other than the original's; and whether the service
      rejected them: a KRB-ERROR in the token the service sent back on that connection before the
      next AP-REQ (``kerberos_ap``: MIT's SPNEGO reject carries KRB_AP_ERR_REPEAT), else the carrier's
      response to the request (its transactions frame, joined on the carrier message's frame and
      connection: ``is_error``, e.g. an LDAP bindResponse other than success / saslBindInProgress, an
      SMB2 SESSION_SETUP error), else an AP-REP sent back (accepted: mutual authentication went on).
      A carrier without a transactions frame (HTTP today) is judged by the Kerberos tokens alone.
    * ``kdc_request_repeat``: byte-identical AS-REQ / TGS-REQ (``kerberos_messages.request_digest``)
      to one KDC. A TGS-REQ carries its own AP-REQ (PA-TGS-REQ), so a replayed TGS-REQ is counted
      here, not as an authenticator replay. Whether the KDC answered it from its lookaside cache:
      the reply's digest equals the reply to the first copy.
    * ``repeat_error``: KRB-ERROR 34 (KRB_AP_ERR_REPEAT) from a KDC or a service that no finding of
      the two kinds above explains (the AP-REQs they reject were not captured or carry no tag).

References: RFC 4120 §3.2.3 (replay cache), §5.5.1 (AP-REQ), §3.1.5 and §10 (clock skew, 5
minutes), §5.9.1 / §7.5.9 (KRB-ERROR, KRB_AP_ERR_REPEAT); RFC 4121 (the krb5 GSS-API token); RFC
4178 (SPNEGO); RFC 4752 (SASL GSSAPI); MIT krb5 rc_base.c (the tag), kdc/replay.c (the lookaside).

Known false positives / limits
    * TCP retransmissions: the same bytes sent again at the TCP layer are not a replay. The
      messages frames are built from the reassembled stream (the first copy of every stream byte
      wins, analyzer/tcp/reassembly.py), so a retransmitted segment never becomes a second message:
      the detector counts messages, never segments.
    * A client's own UDP retries of a KDC request (same flow: same address and port, identical bytes,
      after its kdc_timeout; MIT's default max_retries is 3) and its switch to TCP with the same
      request after KRB_ERR_RESPONSE_TOO_BIG or a UDP timeout (RFC 4120 §7.2.1) are the protocol
      working; the KDC's lookaside answers them. They are reported as ``kdc_request_repeat`` at most
      ``low``, and only when an episode has ``min_repeats`` of them (retry storms are the
      ``retry_storm`` detector's business).
    * SPNEGO renegotiation: a client may resend its optimistic mechToken on the same connection in
      a later NegTokenResp when the server did not process it; up to ``in_flow_resends`` copies of a
      tag on one connection beyond its first are not counted, unless the service answered the copy
      before with an AP-REP or a KRB-ERROR (it processed that one: the next is a replay). Copies on
      other connections always are.
    * What the capture cannot show: an AP-REQ whose authenticator etype has no known checksum
      length (no tag: counted as untagged and named in the explanation), carriers the capture
      cannot read (LDAPS / StartTLS, SMB3 encryption, HTTPS: no ``kerberos_ap`` rows at all),
      and services whose replay cache is keyed otherwise (Heimdal, Windows: the tag is MIT's; a
      byte-identical authenticator has the same tag in every implementation, so repeats are still
      repeats, only a service that compares less would reject fewer).

Client identity: the address (the ``client_identity`` column says "address"): a replayer opens a
fresh connection (new port) for every copy, so ports would make every copy a client.

A finding starts at the first counted copy (the original it repeats is in its evidence) and ends at
the last.

Severity rule (per episode; ``repeats`` = copies counted as above, the rate over their span, at
least ``rate_span_floor_ns``): ``low`` from ``min_repeats``; ``medium`` from ``medium_repeats``, or
when copies came from another address than the original's; ``high`` from ``high_repeats`` at a rate
of at least ``high_rate_per_s``, or when the service *accepted* at least ``min_accepted_for_high``
copies (its replay cache let them through); ``critical`` from ``critical_repeats`` at
``critical_rate_per_s``. A KDC repeat on the client's own flow (a retry) is at most ``low``.
``repeat_error``: the same scale on the count of errors.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.decoders.kerberos import ERROR_CODES  # RFC 4120 §7.5.9 names, where a row lacks error_name

from .base import (NS_PER_S, TRANSACTION_FRAMES, empty_findings, findings, fmt_ns, optional_frame,
                   resolution_ns)
from .params import LOWER, param

NAME = "replay"
KINDS = ("authenticator_replay", "kdc_request_repeat", "repeat_error")
CARRIERS = ("ldap", "smb2", "http")  # GSS-API carriers whose transactions say whether a copy was rejected
CARRIER_TX = {c: f"{c}_transactions" for c in CARRIERS}
REQUIRES = ("kerberos_ap", "kerberos_messages", "kerberos_transactions", "interfaces",
            *(f for f in TRANSACTION_FRAMES if f in CARRIER_TX.values()))
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
PARTITION = "server"
ORDER = 15  # where it runs and is listed (detectors/__init__.py)
KRB_AP_ERR_REPEAT = 34
SEVERITY_ORDER = ("informational", "low", "medium", "high", "critical")


@dataclass(frozen=True)
class Params:
    """Thresholds and windows of the replay detector."""

    window_ns: int = param(300_000_000_000, "an episode ends when no copy came for this long: the replay "
                                            "cache's horizon, the 5-minute clock skew (RFC 4120 §3.2.3, §10)",
                           unit="ns", lo=1)
    min_repeats: int = param(2, "copies (after the first) of authenticators to one service, or of one KDC "
                                "request, in an episode before reporting (low)", unit="copies", gate=LOWER, lo=1)
    medium_repeats: int = param(5, "severity: medium from this many copies", unit="copies", gate=LOWER, lo=1)
    high_repeats: int = param(50, "severity: high from this many copies ...", unit="copies", gate=LOWER, lo=1)
    high_rate_per_s: float = param(20.0, "... at this rate or more", unit="copies/s", gate=LOWER, lo=0.0)
    critical_repeats: int = param(1000, "severity: critical from this many copies ...", unit="copies", gate=LOWER,
                                  lo=1)
    critical_rate_per_s: float = param(1000.0, "... at this rate or more", unit="copies/s", gate=LOWER, lo=0.0)
    rate_span_floor_ns: int = param(1_000_000_000, "the rate is copies over their span, the span at least this "
                                                   "(a burst of 5 in 1 ms is not 5000/s)", unit="ns", gate=LOWER,
                                    lo=1)
    min_accepted_for_high: int = param(1, "at least high when the service accepted this many copies (its replay "
                                          "cache let them through)", unit="copies", gate=LOWER, lo=1)
    foreign_medium: int = param(1, "at least medium when this many copies came from an address other than the "
                                   "original sender's", unit="copies", gate=LOWER, lo=1)
    in_flow_resends: int = param(1, "copies of one tag on one connection beyond its first that are not counted "
                                    "(SPNEGO renegotiation resends the optimistic token)", unit="copies",
                                 gate=LOWER, lo=0)


def _scale(n: int, rate: float, p: Params) -> str:
    if n >= p.critical_repeats and rate >= p.critical_rate_per_s:
        return "critical"
    if n >= p.high_repeats and rate >= p.high_rate_per_s:
        return "high"
    if n >= p.medium_repeats:
        return "medium"
    return "low" if n >= p.min_repeats else "informational"


def _at_least(sev: str, floor: str) -> str:
    return max(sev, floor, key=SEVERITY_ORDER.index)


def _rate(n: int, span_ns: int, p: Params, tick: float) -> float:
    return n / (max(span_ns, p.rate_span_floor_ns, tick) / NS_PER_S)


def _rate_words(n: int, span_ns: int, rate: float, p: Params) -> str:
    """"within 196 ms (255/s; 50/s over the 1 s the rate is measured over at least)"."""
    if span_ns >= p.rate_span_floor_ns:
        return f"within {fmt_ns(span_ns)} ({rate:.3g}/s)"
    raw = f"{n / (span_ns / NS_PER_S):.3g}/s; " if span_ns > 0 else ""
    return f"within {fmt_ns(span_ns)} ({raw}{rate:.3g}/s over the {fmt_ns(p.rate_span_floor_ns)} rates are measured over)"


def _s(c: str) -> pl.Expr:
    return pl.col(c).cast(pl.String)


def _with_firsts(df: pl.DataFrame, key: str, cols: dict[str, str]) -> pl.DataFrame:
    """``df`` (in time order) with ``k`` (0 for the first row of its ``key``, 1 for the later ones) and,
    per row, the first row's ``cols`` (column -> new name). A join on the first rows, not a window over
    ``key``: windows over a key with one group per row cost far more."""
    firsts = df.filter(pl.col(key).is_first_distinct()).select(key, *[pl.col(c).alias(a) for c, a in cols.items()])
    return df.with_columns((~pl.col(key).is_first_distinct()).cast(pl.UInt32).alias("k")) \
        .join(firsts, on=key, how="left", maintain_order="left")


def _episodes(rows: pl.DataFrame, by: list[str], window_ns: int) -> pl.DataFrame:
    """``rows`` (sorted by ts_ns within ``by``) with ``_ep``: a new episode after a gap > window_ns."""
    gap = (pl.col("ts_ns") - pl.col("ts_ns").shift(1).over(by)).fill_null(window_ns + 1)
    return rows.with_columns((gap > window_ns).cum_sum().over(by).alias("_ep"))


# -- authenticator replays ---------------------------------------------------------------------------

def _empty_ap() -> pl.DataFrame:
    return pl.DataFrame(schema={"carrier": pl.String, "frame": pl.UInt32, "frame_last": pl.UInt32,
                                "ts_ns": pl.Int64, "src": pl.String, "dst": pl.String, "flowkey": pl.String,
                                "flow": pl.UInt32, "message": pl.String, "realm": pl.String, "sname": pl.String,
                                "rc_tag": pl.Binary, "error_code": pl.Int32, "error_name": pl.String,
                                "authenticator_etype": pl.Int32})


def ap_rows(capture) -> pl.DataFrame:
    """The ``kerberos_ap`` rows as the detector reads them (strings for addresses and enums, a
    ``flowkey`` telling carriers' flow ids apart), empty when the capture has none."""
    ap = optional_frame(capture, "kerberos_ap")
    if ap is None or ap.height == 0:
        return _empty_ap()
    last = pl.col("frame_last") if "frame_last" in ap.columns else pl.col("frame")
    return ap.filter(pl.col("ts_ns").is_not_null()).select(
        _s("carrier"), pl.col("frame").cast(pl.UInt32), last.cast(pl.UInt32).alias("frame_last"),
        pl.col("ts_ns").cast(pl.Int64), _s("src").fill_null("?"), _s("dst").fill_null("?"),
        pl.concat_str([_s("carrier"), _s("transport"), pl.col("flow").cast(pl.String)], separator=":")
        .alias("flowkey"), pl.col("flow").cast(pl.UInt32), _s("message"), _s("realm"), _s("sname"),
        pl.col("rc_tag").cast(pl.Binary), pl.col("error_code").cast(pl.Int32),
        (_s("error_name") if "error_name" in ap.columns else pl.lit(None, pl.String)).alias("error_name"),
        pl.col("authenticator_etype").cast(pl.Int32),
    ).sort("ts_ns", "frame")


def _outcomes(capture, req: pl.DataFrame, ap: pl.DataFrame, within_ns: int) -> pl.DataFrame:
    """Per AP-REQ row (``rid``): ``outcome`` accepted / rejected / unanswered, ``status`` and the
    response frame, from the carrier's transactions (request_frame = the carrier message's last or
    first frame, on the same connection) and KRB-ERROR 34 tokens the service sent back."""
    parts = []
    for carrier, name in CARRIER_TX.items():
        if name not in REQUIRES:
            continue
        tx = optional_frame(capture, name)  # every carrier's (read alike on every capture with AP-REQs)
        mine = req.filter(pl.col("carrier") == carrier)
        if tx is None or tx.height == 0 or mine.height == 0:
            continue
        t = tx.select(pl.col("flow").cast(pl.UInt32), pl.col("request_frame").cast(pl.UInt32),
                      pl.col("response_frame").cast(pl.UInt32).alias("resp_frame"), _s("status"),
                      pl.col("is_error"), pl.col("answered"))
        for key in ("frame_last", "frame"):
            parts.append(mine.select("rid", "flow", key).join(t, left_on=["flow", key],
                                                              right_on=["flow", "request_frame"]).drop(key))
    if parts:
        got = pl.concat(parts).unique("rid", keep="first", maintain_order=True)
    else:
        got = pl.DataFrame(schema={"rid": pl.UInt32, "flow": pl.UInt32, "resp_frame": pl.UInt32,
                                   "status": pl.String, "is_error": pl.Boolean, "answered": pl.Boolean})
    out = req.select("rid", "flowkey", "ts_ns").join(got.drop("flow"), on="rid", how="left")
    # a Kerberos answer on the connection belongs to the latest AP-REQ before it: not past the next one
    nxt = ap.filter(pl.col("message") == "ap_req").select("flowkey", "ts_ns").sort("flowkey", "ts_ns").with_columns(
        pl.when(pl.col("flowkey").shift(-1) == pl.col("flowkey")).then(pl.col("ts_ns").shift(-1))
        .alias("next_ts")).unique(["flowkey", "ts_ns"], keep="first")
    out = out.join(nxt, on=["flowkey", "ts_ns"], how="left")
    # the first Kerberos answer (AP-REP or KRB-ERROR) the service sent back on the connection after it
    krb = ap.filter(pl.col("message").is_in(["ap_rep", "krb_error"])).select(
        "flowkey", pl.col("ts_ns").alias("krb_ts"), pl.col("frame").alias("krb_frame"),
        pl.col("message").alias("krb_msg"), pl.col("error_code").alias("krb_code"),
        pl.col("error_name").alias("krb_name")).sort("krb_ts")
    out = out.sort("ts_ns").join_asof(krb, left_on="ts_ns", right_on="krb_ts", by="flowkey", strategy="forward",
                                      tolerance=within_ns, check_sortedness=False)
    late = pl.col("next_ts").is_not_null() & (pl.col("krb_ts") > pl.col("next_ts"))
    out = out.with_columns(pl.when(late.fill_null(False)).then(None).otherwise(pl.col(c)).alias(c)
                           for c in ("krb_ts", "krb_frame", "krb_msg", "krb_code", "krb_name"))
    krb_err = (pl.col("krb_msg") == "krb_error").fill_null(False)
    ap_rep = (pl.col("krb_msg") == "ap_rep").fill_null(False)
    answered = pl.col("answered").fill_null(False)
    return out.select(
        "rid", "krb_ts",
        pl.when(krb_err | (answered & pl.col("is_error").fill_null(False))).then(pl.lit("rejected"))
        .when(answered | ap_rep).then(pl.lit("accepted")).otherwise(pl.lit("unanswered")).alias("outcome"),
        pl.when(krb_err).then(pl.coalesce(
            pl.col("krb_name"), pl.col("krb_code").cast(pl.Int64).replace_strict(ERROR_CODES, default=None,
                                                                                 return_dtype=pl.String),
            pl.format("KRB-ERROR {}", pl.col("krb_code"))))
        .when(answered).then(pl.col("status")).when(ap_rep).then(pl.lit("AP-REP")).alias("status"),
        pl.when(krb_err).then(pl.col("krb_frame")).otherwise(pl.coalesce(pl.col("resp_frame"), pl.col("krb_frame")))
        .alias("resp_frame"))


def copies(capture, params: Params = Params(), ap: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every tagged AP-REQ in a GSS-API carrier with what the detector decides about it: ``k`` (0 for
    the first copy of its tag at its service, 1 for the others), ``counted`` (a copy counted as a replay), ``foreign``
    (sent from another address than the first copy), ``outcome`` / ``status`` / ``resp_frame`` (the
    service's answer) and ``service`` (sname@realm). The proof chart draws this table. ``ap``:
    :func:`ap_rows` of the capture, when the caller has them."""
    ap = ap_rows(capture) if ap is None else ap
    req = ap.filter((pl.col("message") == "ap_req") & (pl.col("carrier") != "kdc") & pl.col("rc_tag").is_not_null())
    if req.height == 0:
        return req.with_columns(pl.lit(None, pl.UInt32).alias("rid"))
    svc = ["dst", "sname", "realm"]
    req = req.with_row_index("rid").with_columns(
        pl.concat_str([pl.col("sname").fill_null("?"), pl.col("realm").fill_null("?")], separator="@")
        .alias("service"))
    # one 64-bit key per (service, tag) and per (service, tag, connection): windows over them are
    # much cheaper than over the binary tag itself
    req = req.with_columns(pl.struct(*svc, "rc_tag").hash().alias("_tag")).with_columns(
        pl.struct("_tag", "flowkey").hash().alias("_tag_flow"))
    req = _with_firsts(req, "_tag", {"src": "first_src", "ts_ns": "first_ts_ns", "frame": "first_frame"})
    req = req.join(_outcomes(capture, req, ap, params.window_ns), on="rid", how="left").sort("rid")
    req = _resends(req).with_columns(
        ((pl.col("k") > 0) & ((pl.col("_in_flow") == 0) | pl.col("_prev_processed")
                              | (pl.col("_in_flow") > params.in_flow_resends))).alias("counted"),
        (pl.col("src") != pl.col("first_src")).alias("foreign"),
    )
    return req.drop("_in_flow", "_prev_processed", "_tag_flow", "krb_ts")


def _resends(req: pl.DataFrame) -> pl.DataFrame:
    """``_in_flow`` (a copy's position among the copies of its tag on its connection, 0 for the first)
    and ``_prev_processed`` (the service answered the previous copy on that connection with an AP-REP or
    a KRB-ERROR: it processed it, so this one is not a SPNEGO resend of an unprocessed optimistic token).
    Computed over the repeated (tag, connection) pairs only: a window with one group per row is slow."""
    dup = req.filter(pl.col("_tag_flow").is_duplicated())
    if dup.height == 0:
        return req.with_columns(pl.lit(0, pl.UInt32).alias("_in_flow"), pl.lit(False).alias("_prev_processed"))
    dup = dup.sort("_tag_flow", "ts_ns", "rid").select(
        "rid", pl.int_range(pl.len(), dtype=pl.UInt32).over("_tag_flow").alias("_in_flow"),
        (pl.col("krb_ts").shift(1).over("_tag_flow") <= pl.col("ts_ns")).fill_null(False).alias("_prev_processed"))
    return req.join(dup, on="rid", how="left", maintain_order="left").with_columns(
        pl.col("_in_flow").fill_null(0), pl.col("_prev_processed").fill_null(False))


def _untagged(ap: pl.DataFrame) -> pl.DataFrame:
    return ap.filter((pl.col("message") == "ap_req") & (pl.col("carrier") != "kdc") & pl.col("rc_tag").is_null()) \
        .group_by("dst", "sname", "realm").agg(pl.len().alias("untagged"),
                                               pl.col("authenticator_etype").drop_nulls().unique().sort()
                                               .alias("untagged_etypes"))


def _authenticator_findings(capture, ap: pl.DataFrame, p: Params, tick: float) -> tuple[list[dict], pl.DataFrame]:
    c = copies(capture, p, ap)
    spans = pl.DataFrame(schema={"server": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64})
    if c.height == 0:
        return [], spans
    rep = _episodes(c.filter(pl.col("counted")).sort("dst", "sname", "realm", "ts_ns"), ["dst", "sname", "realm"],
                    p.window_ns)
    if rep.height == 0:
        return [], spans
    firsts = c.filter(pl.col("k") == 0).select("_tag", "outcome", "status", pl.col("frame").alias("orig_frame"),
                                                pl.col("resp_frame").alias("orig_resp"))
    rep = rep.join(firsts.rename({"outcome": "orig_outcome", "status": "orig_status"}), on="_tag", how="left")
    eps = rep.group_by("dst", "sname", "realm", "_ep").agg(
        pl.len().alias("n"), pl.col("_tag").n_unique().alias("tags"), pl.col("service").first(),
        pl.col("first_ts_ns").min().alias("start_ns"), pl.col("ts_ns").min().alias("rep_start"),
        pl.col("ts_ns").max().alias("end_ns"), pl.col("src").n_unique().alias("clients"),
        pl.col("src").unique().sort().alias("srcs"), pl.col("first_src").unique().sort().alias("orig_srcs"),
        pl.col("foreign").sum().alias("foreign"),
        (pl.col("outcome") == "rejected").sum().alias("rejected"),
        (pl.col("outcome") == "accepted").sum().alias("accepted"),
        (pl.col("outcome") == "unanswered").sum().alias("unanswered"),
        (pl.col("status") == "KRB_AP_ERR_REPEAT").sum().alias("krb_errors"),
        pl.col("status").filter(pl.col("outcome") == "rejected").drop_nulls().mode().sort().first().alias("reject_status"),
        pl.col("status").filter(pl.col("outcome") == "accepted").drop_nulls().mode().sort().first().alias("accept_status"),
        pl.col("orig_status").drop_nulls().first(), pl.col("carrier").unique().sort().alias("carriers"),
        pl.concat_list("orig_frame", "orig_resp", "frame", "resp_frame").explode().drop_nulls().alias("frames"),
    ).sort("dst", "sname", "realm", "start_ns")
    eps = eps.join(_untagged(ap), on=["dst", "sname", "realm"], how="left", nulls_equal=True)
    rows = []
    for r in eps.iter_rows(named=True):
        n, span = r["n"], r["end_ns"] - r["rep_start"]
        rate = _rate(n, span, p, tick)
        sev = _scale(n, rate, p)
        if r["foreign"] >= p.foreign_medium and sev != "informational":
            sev = _at_least(sev, "medium")
        if r["accepted"] >= p.min_accepted_for_high and sev != "informational":
            sev = _at_least(sev, "high")
        if sev == "informational":
            continue
        rows.append(_authenticator_row(r, n, span, rate, sev, p))
    spans = eps.select(pl.col("dst").alias("server"), "start_ns", "end_ns")
    return rows, spans


def _outcome_words(r: dict) -> str:
    bits = []
    if r["rejected"]:
        why = f" ({r['reject_status']})" if r["reject_status"] else ""
        bits.append(f"the service rejected {r['rejected']}{why}")
    if r["accepted"]:
        why = f" ({r['accept_status']})" if r["accept_status"] else ""
        bits.append(f"ACCEPTED {r['accepted']}{why}: its replay cache let them through")
    if r["unanswered"]:
        bits.append(f"{r['unanswered']} got no answer the capture shows")
    return "; ".join(bits) or "no answer visible"


def _authenticator_row(r: dict, n: int, span: int, rate: float, sev: str, p: Params) -> dict:
    origin = ", ".join(r["orig_srcs"])
    others = [s for s in r["srcs"] if s not in r["orig_srcs"]]
    who = (f"from {r['clients']} address(es)" + (f", {r['foreign']} of them from {', '.join(others[:4])}"
                                                 f"{' ...' if len(others) > 4 else ''}, not the original sender "
                                                 f"{origin}" if r["foreign"] else f", all from the original sender "
                                                                                     f"{origin}"))
    untagged = (f"; {r['untagged']} other AP-REQ(s) to it carry no tag (authenticator etype "
                f"{', '.join(map(str, r['untagged_etypes'] or [])) or 'unknown'}: checksum length unknown) and are "
                "not compared" if r.get("untagged") else "")
    return {
        "kind": "authenticator_replay", "severity": sev, "start_ns": r["rep_start"], "end_ns": r["end_ns"],
        "client": origin if len(r["srcs"]) == 1 else None, "server": r["dst"], "resource": r["service"],
        "clients": r["clients"], "client_identity": "address", "metric": "replayed_authenticators",
        "value": float(n), "threshold": float(p.min_repeats), "unit": "copies",
        "evidence_frames": [int(x) for x in r["frames"]],
        "explanation": (
            f"{n} copies of {r['tags']} Kerberos authenticator(s) to {r['service']} at {r['dst']} "
            f"(in {'/'.join(r['carriers'])} {'binds' if r['carriers'] == ['ldap'] else 'authentications'}, "
            f"identical replay-cache tags) {_rate_words(n, span, rate, p)} {who}; "
            f"{_outcome_words(r)}"
            + (f" (first copy: {r['orig_status']})" if r["orig_status"] else "")
            + f"{untagged}. A service's replay cache keeps tags for the clock skew ({fmt_ns(p.window_ns)}, "
              "RFC 4120 §3.2.3): each copy costs it a decryption and a lookup"),
    }


# -- identical KDC requests ---------------------------------------------------------------------------

def kdc_copies(capture, params: Params = Params()) -> pl.DataFrame:
    """Byte-identical AS-REQ / TGS-REQ per KDC (``request_digest``): ``k`` (0 for the first copy, 1 for
    the others),
    ``retry`` (a copy on the first copy's flow, or the switch from UDP to TCP: the client's own
    retry), the reply's digest and whether it equals the first reply's (``lookaside``)."""
    m = optional_frame(capture, "kerberos_messages")
    if m is None or m.height == 0 or "request_digest" not in m.columns:
        return pl.DataFrame()
    req = m.filter(pl.col("message").cast(pl.String).is_in(["AS-REQ", "TGS-REQ"]) & pl.col("from_client")
                   & pl.col("request_digest").is_not_null() & pl.col("ts_first_ns").is_not_null())
    if req.height == 0:
        return pl.DataFrame()
    req = req.select(
        _s("message"), pl.col("frame_first").alias("frame"), "frame_last", pl.col("ts_first_ns").alias("ts_ns"),
        _s("src").fill_null("?"), _s("dst").fill_null("?"), _s("transport"), "flow", _s("sname"), _s("realm"),
        _s("cname"), "request_digest",
    ).sort("ts_ns", "frame")
    g = ["dst", "request_digest"]
    req = _with_firsts(req.with_columns(pl.struct(*g).hash().alias("_req")), "_req",
                       {"src": "first_src", "flow": "first_flow", "transport": "first_transport"})
    req = req.with_columns(
        (((pl.col("flow") == pl.col("first_flow")) & (pl.col("transport") == pl.col("first_transport")))
         | ((pl.col("first_transport") == "udp") & (pl.col("transport") == "tcp")
            & (pl.col("src") == pl.col("first_src")))).alias("retry"),
        (pl.col("src") != pl.col("first_src")).alias("foreign"),
    )
    tx = optional_frame(capture, "kerberos_transactions")
    if tx is not None and tx.height:
        rd = m.select(pl.col("frame_last").alias("resp_frame"), pl.col("request_digest").alias("resp_digest"))
        t = tx.select(_s("transport"), "flow", pl.col("request_frame").alias("frame_last"),
                      pl.col("response_frame").alias("resp_frame"), _s("status")) \
            .join(rd.unique("resp_frame"), on="resp_frame", how="left")
        req = req.join(t, on=["transport", "flow", "frame_last"], how="left")
    else:
        req = req.with_columns(pl.lit(None, pl.UInt32).alias("resp_frame"), pl.lit(None, pl.String).alias("status"),
                               pl.lit(None, pl.UInt64).alias("resp_digest"))
    # the lookaside resends the reply it sent before: the same reply bytes as an earlier copy's
    earlier = ~pl.struct("_req", "resp_digest").is_first_distinct()
    return req.with_columns((pl.col("resp_digest").is_not_null() & earlier).alias("lookaside")).drop("_req")


def _kdc_findings(capture, p: Params, tick: float) -> tuple[list[dict], pl.DataFrame]:
    c = kdc_copies(capture, p)
    spans = pl.DataFrame(schema={"server": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64})
    if c.height == 0:
        return [], spans
    firsts = c.filter(pl.col("k") == 0).select("dst", "request_digest", pl.col("ts_ns").alias("orig_ts"),
                                                pl.col("frame").alias("orig_frame"),
                                                pl.col("resp_frame").alias("orig_resp"))
    rep = c.filter(pl.col("k") > 0).join(firsts, on=["dst", "request_digest"], how="left").with_columns(
        pl.col("orig_resp").is_null().alias("orig_unanswered"))
    if rep.height == 0:
        return [], spans
    by = ["dst", "message", "sname", "realm"]
    rep = _episodes(rep.sort(*by, "ts_ns", nulls_last=True), by, p.window_ns)
    eps = rep.group_by(*by, "_ep").agg(
        pl.len().alias("n"), (~pl.col("retry")).sum().alias("replays"), pl.col("retry").sum().alias("retries"),
        pl.col("request_digest").n_unique().alias("requests"), pl.col("orig_ts").min().alias("start_ns"),
        pl.col("ts_ns").min().alias("rep_start"), pl.col("ts_ns").max().alias("end_ns"),
        pl.col("src").n_unique().alias("clients"), pl.col("src").unique().sort().alias("srcs"),
        pl.col("first_src").unique().sort().alias("orig_srcs"), pl.col("foreign").sum().alias("foreign"),
        pl.col("lookaside").sum().alias("lookaside"), pl.col("resp_frame").is_not_null().sum().alias("answered"),
        pl.col("request_digest").filter(pl.col("orig_unanswered")).n_unique().alias("orig_unanswered"),
        pl.col("status").drop_nulls().mode().sort().first().alias("status"), pl.col("cname").drop_nulls().first(),
        pl.col("transport").unique().sort().alias("transports"),
        pl.concat_list("orig_frame", "orig_resp", "frame", "resp_frame").explode().drop_nulls().alias("frames"),
    ).sort(*by, "start_ns", nulls_last=True)
    rows = []
    for r in eps.iter_rows(named=True):
        n, span = r["n"], r["end_ns"] - r["rep_start"]
        rate = _rate(r["replays"], span, p, tick)
        if r["replays"]:
            sev = _scale(r["replays"], rate, p)
            if r["foreign"] >= p.foreign_medium and sev != "informational":
                sev = _at_least(sev, "medium")
        else:  # only the clients' own retries
            sev = "low" if n >= p.min_repeats else "informational"
        if sev == "informational":
            continue
        rows.append(_kdc_row(r, n, span, _rate(n, span, p, tick), sev, p))
    return rows, eps.select(pl.col("dst").alias("server"), "start_ns", "end_ns")


def _kdc_row(r: dict, n: int, span: int, rate: float, sev: str, p: Params) -> dict:
    what = f"{r['message']} for {r['sname'] or '?'}@{r['realm'] or '?'}" + (f" ({r['cname']})" if r["cname"] else "")
    origin = ", ".join(r["orig_srcs"])
    others = [s for s in r["srcs"] if s not in r["orig_srcs"]]
    if r["replays"]:
        kind = (f"{r['replays']} on new flows (replays: a new port or address)"
                + (f", {r['foreign']} from {', '.join(others[:4])} rather than the original sender {origin}"
                   if r["foreign"] else f", all from the original sender {origin}")
                + (f"; {r['retries']} more on the client's own flow (its retries)" if r["retries"] else ""))
    else:
        kind = (f"all on the client's own flow or its switch to TCP: {origin}'s own retries (RFC 4120 §7.2.1), "
                "which the KDC's lookaside cache exists for; see retry_storm for a storm of them")
    answered = (f"the KDC answered {r['answered']}, {r['lookaside']} of them with the same reply bytes as an earlier "
                "copy's" + (" (its lookaside cache: the request was not processed again)" if r["lookaside"] else "")
                if r["answered"] else "no KDC answer visible")
    if r["answered"] and r["orig_unanswered"]:
        answered += f"; the reply to the first copy of {r['orig_unanswered']} is not in the capture (lost?)"
    return {
        "kind": "kdc_request_repeat", "severity": sev, "start_ns": r["rep_start"], "end_ns": r["end_ns"],
        "client": origin if len(r["srcs"]) == 1 and len(r["orig_srcs"]) == 1 else None, "server": r["dst"],
        "resource": f"{r['sname']}@{r['realm']}" if r["sname"] else None, "clients": r["clients"],
        "client_identity": "address", "metric": "repeated_kdc_requests", "value": float(r["replays"] or n),
        "threshold": float(p.min_repeats), "unit": "copies", "evidence_frames": [int(x) for x in r["frames"]],
        "explanation": (
            f"{n} byte-identical repeat(s) of {r['requests']} {what} sent to the KDC {r['dst']} over "
            f"{'/'.join(r['transports'])} {_rate_words(n, span, rate, p)}: {kind}; {answered}"
            + (f" (status {r['status']})" if r["status"] else "")),
    }


# -- KRB-ERROR 34 nobody else explains ------------------------------------------------------------------

def _error_findings(capture, ap: pl.DataFrame, p: Params, tick: float, spans: pl.DataFrame) -> list[dict]:
    parts = [ap.filter((pl.col("message") == "krb_error") & (pl.col("error_code") == KRB_AP_ERR_REPEAT))
             .select("ts_ns", "frame", pl.col("src").alias("server"), pl.col("dst").alias("client"), "carrier")]
    m = optional_frame(capture, "kerberos_messages")
    if m is not None and m.height:
        parts.append(m.filter((pl.col("message").cast(pl.String) == "KRB-ERROR")
                              & (pl.col("error_code") == KRB_AP_ERR_REPEAT))
                     .select(pl.col("ts_first_ns").alias("ts_ns"), pl.col("frame_first").cast(pl.UInt32)
                             .alias("frame"), _s("src").alias("server"), _s("dst").alias("client"),
                             pl.lit("kdc").alias("carrier")))
    errs = pl.concat(parts).filter(pl.col("ts_ns").is_not_null()).with_columns(
        pl.col("server").fill_null("?"), pl.col("client").fill_null("?")).sort("server", "ts_ns")
    if errs.height == 0:
        return []
    if spans.height:  # explained by a finding of the same server (its episode plus the window)
        win = spans.with_columns(pl.col("end_ns") + p.window_ns)
        hit = errs.join(win, on="server").filter(pl.col("ts_ns").is_between("start_ns", "end_ns"))
        errs = errs.join(hit.select("frame").unique(), on="frame", how="anti")
    if errs.height == 0:
        return []
    errs = _episodes(errs, ["server"], p.window_ns)
    untagged = _untagged(ap).group_by(pl.col("dst").alias("server")).agg(pl.col("untagged").sum())
    eps = errs.group_by("server", "_ep").agg(
        pl.len().alias("n"), pl.col("ts_ns").min().alias("start_ns"), pl.col("ts_ns").max().alias("end_ns"),
        pl.col("client").n_unique().alias("clients"), pl.col("client").unique().sort().alias("ids"),
        pl.col("carrier").unique().sort().alias("carriers"), pl.col("frame").alias("frames"),
    ).join(untagged, on="server", how="left").sort("server", "start_ns")
    rows = []
    for r in eps.iter_rows(named=True):
        n, span = r["n"], r["end_ns"] - r["start_ns"]
        rate = _rate(n, span, p, tick)
        sev = _scale(n, rate, p) if n >= p.min_repeats else ("low" if n >= 1 else "informational")
        why = (f"; {r['untagged']} AP-REQ(s) to it carry no replay-cache tag the capture can compute (unknown "
               "checksum length)" if r.get("untagged") else
               "; the rejected AP-REQs are not in the capture (or inside a carrier it cannot read)")
        rows.append({
            "kind": "repeat_error", "severity": sev, "start_ns": r["start_ns"], "end_ns": r["end_ns"],
            "client": r["ids"][0] if len(r["ids"]) == 1 else None, "server": r["server"], "resource": None,
            "clients": r["clients"], "client_identity": "address", "metric": "krb_ap_err_repeat",
            "value": float(n), "threshold": 1.0, "unit": "errors", "evidence_frames": [int(x) for x in r["frames"]],
            "explanation": (
                f"{r['server']} answered {n} KRB-ERROR 34 (KRB_AP_ERR_REPEAT: 'request is a replay') to "
                f"{r['clients']} client(s) ({', '.join(r['ids'][:4])}{' ...' if len(r['ids']) > 4 else ''}) in "
                f"{'/'.join(r['carriers'])} within {fmt_ns(span)} ({rate:.3g}/s){why}"),
        })
    return rows


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: replayed authenticators per service, byte-identical KDC requests, and KRB-ERROR 34
    nobody else explains (see the module doc)."""
    tick = resolution_ns(capture)
    ap = ap_rows(capture)
    a_rows, a_spans = _authenticator_findings(capture, ap, params, tick)
    k_rows, k_spans = _kdc_findings(capture, params, tick)
    e_rows = _error_findings(capture, ap, params, tick, pl.concat([a_spans, k_spans]))
    rows = a_rows + k_rows + e_rows
    if not rows:
        return empty_findings()
    return findings(pl.DataFrame(rows, infer_schema_length=None), detector=NAME, params=params)
