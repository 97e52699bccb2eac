"""Thundering herd: many distinct clients send the same request at once.

**Pathology.** Clients that cache the same thing for the same time (a DNS answer with one TTL, a
Kerberos ticket, a configuration file), that start on the same timer (cron at :00, a GPO refresh, a
fleet rebooting) or that all wait for the same failed server come back *together*: the server sees
the request rate of a whole fleet inside a few milliseconds instead of spread over the cache
lifetime. Its queue grows, latency rises for everybody, and a server that falls over under the herd
makes the clients retry together again.

**Signal.** Per server and *request key* (protocol, operation and resource: DNS name — compared
case-insensitively — and type, the Kerberos principal asked for — ``krbtgt/REALM@REALM`` for an AS
exchange, the service for TGS —, the LDAP bind DN or search base, the SMB2 path, the NFS path or
directory: below), the *arrivals*:
a client's request, its repeats within ``repeat_ns`` counted once; a Kerberos login counts once (its
PREAUTH round trip is not a second request); requests that expect no answer (LDAP unbind) do not
count. A herd is a stretch of arrivals denser than
``lambda = max(min_clients / window_ns, rate_factor x baseline)``; the baseline is the key's median
arrivals per ``baseline_bin_ns`` between its first and last arrival (empty bins included: herds
occupy few bins, so they do not raise their own baseline; over fewer than ``baseline_min_bins`` bins
there is none: a herd that fills two of three bins would be its own baseline).
The stretch is the maximum-scoring segment of ``arrivals - lambda x time`` (Kadane over each key's
arrivals, one Numba pass), so it starts and ends where the arrivals do; its edges are trimmed by a
second pass at 1/``trim_factor`` of its own rate (background that merely arrives at about lambda
falls away). It is a herd when it holds at least ``min_clients`` distinct clients, lasts at most
``max_span_ns`` and is at least ``rate_factor`` times the key's rate outside its herds. One finding
per herd episode.

**File systems (NFS).** A transaction frame that carries a resolved ``path`` and the ``name`` an
operation looks up in its directory (``nfs_transactions``) holds file-system requests: LOOKUP and
OPEN name a component in the directory of the current filehandle (RFC 7530 §16.13, §16.16; NFSv3
LOOKUP, RFC 1813 §3.3.3), READ/CLOSE/GETATTR work on the file. Every such request (but the
protocol's set-up operations: SETCLIENTID, EXCHANGE_ID, MOUNT ...) is keyed by its **path whatever
its operation**, so a client's LOOKUP, OPEN, READ and CLOSE of one file are one arrival (they follow
within ``repeat_ns``, as a Kerberos login's steps do), and it is also an arrival at its **parent
directory** (``fh:<hash>`` when only the directory's handle is known): thousands of ranks opening
their own shard of a checkpoint, each a different name, are a herd on the directory, and so are
ranks that LOOKUP the directory and then open files in it. A directory that many clients use at a
steady rate has that rate as its baseline, so it is no herd (the ``rate_factor`` rule above). One
herd shows at two levels then (the path walk's LOOKUPs of the ancestors too): a directory's herd is
dropped in favour of a child's overlapping herd when that one child carries ``nested_share`` of the
directory's (client, name) uses (everybody opened ``model.pt``: the herd is on the file, or on the
deeper directory), otherwise the directory is the herd and its children's herds are dropped; the
explanation then says how many names in the directory were asked for and the most-named one. The
herd's requests (evidence, "outside its herds") are those of its span and its arrivals' repeats.

Reported: herd size (distinct clients), span, rate during the herd vs the key's rate outside its
herds, the server's p99 latency and failure share (errors, or no answer where one was expected)
during the herd vs the ``lookback_ns`` before it (before the first of the server's herds that
overlap it; the lower of the baselines with and without other herds' requests), and the trigger when the
capture shows it: a DNS TTL expiring (at least ``ttl_match_share`` of the herd's clients re-ask
when their own earlier answer + its TTL runs out, within the whole-second granularity of TTLs plus
``ttl_tolerance_ns``; when the clients' earlier answers are not in the capture — fewer than
``ttl_own_answer_share`` of them have one — the key's latest earlier answer), a preceding failure
(the key's requests in the ``failure_lookback_ns`` before failed, at least ``failure_share`` of
them), or a synchronised start (within ``sync_tolerance_ns`` of a whole second).

**Clients** are told apart per server with :func:`detectors.base.client_identity_by`: an address
with requests outstanding at once from several ports is split into address:port clients, others
are addresses; ``client_identity`` is the rule of most of the herd's clients. Concurrent streams of
one address are judged by the same impact rule as distinct hosts — 150 processes or containers on
one node re-asking a name together, 60 parallel ``kinit`` on one GPU node, a fleet behind one NAT
*are* the herd — and the explanation says "N concurrent streams from one address (processes,
containers or NAT)"; only what is demonstrably one stream (one client) is informational. **Vantage:** the herd is judged from the requests
alone; the latency part says when the server's responses are not in the capture; when the capture
shows too little time around the herd to know the key's normal rate (less than the herd's span or
``window_ns``), informational. **Resolution:** spans and rates never use a window shorter than the
capture's timestamp tick; a herd whose requests share one tick is reported "within <tick> (the
capture's timestamp resolution)"; the synchronised-start test is skipped when the tick is coarser
than a tenth of its tolerance.

**Severity** (impact = clients x latency factor, where the latency factor is p99 during / p99
before when that ratio is at least ``latency_factor`` and the p99 rose by at least
``latency_floor_ns``, else 1, capped at ``max_latency_factor``, 100): impact below
``medium_clients``: low; at least ``medium_clients``: medium; at least ``high_impact``: high; at least
``critical_impact``: critical. A failure share during the herd ``error_rate_rise`` or more above the
one before raises it one level. Informational when it cannot judge (above).

**References.** RFC 1035 §7.4 and RFC 2181 §8 (TTL caching), RFC 8767 §5 (serve-stale against
refetch herds), RFC 4120 §3.1-3.3 (AS/TGS exchanges), RFC 4511 §4.2/§4.5 (bind, search), MS-SMB2
§3.3.5.9 (CREATE), RFC 7530 §16.13 (LOOKUP) and §16.16 (OPEN); "thundering herd" in the Linux accept() and cache-stampede literature
(Vattani et al., *Optimal Probabilistic Cache Stampede Prevention*, VLDB 2015).

**Known false positives.** Legitimately synchronised work (a backup window, a deliberate fleet-wide
job) is a herd by this definition: severity then reflects whether the server suffered. Clients
behind one NAT address without concurrent requests count as one. A capture at a resolver's upstream
side sees the resolver, not the herd (it coalesces). The first wave of a retry storm is a herd too
when the clients started together (both findings are then true). Independent clients practically
never reach 10x a key's median rate with 20 distinct clients unless something synchronised them.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.wide_frames import row_wise

from .base import (NS_PER_MS, client_identity_by, fmt_limited, fmt_ns, fmt_number, findings, empty_findings, resolution_ns,
                   severity_from_scale, transaction_frames, PROTOCOL_KINDS, RESOLUTION_TICKS, SEVERITIES,
                   TRANSACTION_FRAMES, protocol_declaration, via_unique)
from .herd_files import fs_keyed, fs_names, fs_protocols, fs_words, one_per_tree
from .herd_search import WINDOW_COLUMNS, herd_segments, key_baselines, stats_columns, window_columns
from .herd_triggers import failure_trigger, ttl_trigger
from .params import LOWER, UPPER, param

NAME = "herd"
KINDS = PROTOCOL_KINDS  # the protocol of the requests
# every frame it reads: each protocol's transactions (from the protocol registry), the packets (the
# observed period) and the interfaces (resolution_ns)
REQUIRES = (*TRANSACTION_FRAMES, "packets", "interfaces")
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
PARTITION = "server"
ORDER = 10  # where it runs and is listed (detectors/__init__.py)

S = 1_000_000_000


@dataclass(frozen=True)
class Params:
    min_clients: int = param(20, "distinct clients a herd needs at least", unit="clients", gate=LOWER, lo=1)
    window_ns: int = param(1_000_000_000, "min_clients within this gives the lowest herd rate", unit="ns", lo=1)
    repeat_ns: int = param(100_000_000, "a client's repeats of one request within this count as one arrival",
                           unit="ns", lo=0)
    rate_factor: float = param(10.0, "the herd rate must be at least this many times the key's baseline rate",
                               unit="x", gate=LOWER, lo=1.0)
    baseline_bin_ns: int = param(1_000_000_000, "baseline = the key's median arrivals per bin of this width",
                                 unit="ns", lo=1)
    baseline_min_bins: int = param(5, "... over at least this many bins (fewer: the herd would be its own "
                                      "baseline; there is none)", unit="bins", lo=1)
    max_span_ns: int = param(10_000_000_000, "a burst longer than this is sustained load, not a herd",
                             unit="ns", gate=UPPER, lo=1)
    trim_factor: float = param(10.0, "a herd's edges are trimmed where arrivals are this much sparser than its "
                                     "mean", unit="x", lo=1.0)
    medium_clients: int = param(30, "impact (clients x latency factor) for medium", unit="clients",
                                gate=LOWER, lo=1)
    high_impact: float = param(300.0, "impact for high", unit="clients", gate=LOWER, lo=1.0)
    critical_impact: float = param(3000.0, "impact for critical", unit="clients", gate=LOWER, lo=1.0)
    latency_factor: float = param(2.0, "p99 during / p99 before at least this counts as latency impact ...",
                                  unit="x", gate=LOWER, lo=1.0)
    latency_floor_ns: int = param(1_000_000, "... when the p99 also rose by at least this", unit="ns",
                                  gate=LOWER, lo=0)
    error_rate_rise: float = param(0.10, "error rate during minus before at least this: one level up",
                                   unit="share", gate=LOWER, lo=0.0, hi=1.0)
    lookback_ns: int = param(60_000_000_000, '"before the herd" (its run of overlapping herds) is this long',
                             unit="ns", lo=1)
    ttl_tolerance_ns: int = param(250_000_000, "slack around answer time + TTL (beyond TTLs' whole seconds)",
                                  unit="ns", lo=0)
    ttl_match_share: float = param(0.5, "share of the herd's clients whose own answer expired for a TTL trigger",
                                   unit="share", lo=0.0, hi=1.0)
    sync_tolerance_ns: int = param(20_000_000, "start within this of a whole second: synchronised start",
                                   unit="ns", lo=0)
    failure_lookback_ns: int = param(10_000_000_000, "failures of the key this long before count as the "
                                                     "trigger ...", unit="ns", lo=0)
    failure_share: float = param(0.5, "... when they are at least this share of its requests there",
                                 unit="share", lo=0.0, hi=1.0)
    ttl_own_answer_share: float = param(0.25, "TTL trigger: when fewer than this share of the herd's clients have "
                                              "their own earlier answer in the capture, the key's latest answer "
                                              "is used instead", unit="share", lo=0.0, hi=1.0)
    nested_share: float = param(0.9, "file-system herds: a directory's herd is its child's when that one child "
                                     "has this share of the directory's (client, name) uses",
                                unit="share", lo=0.0, hi=1.0)
    max_latency_factor: float = param(100.0, "the latency factor in the impact (p99 during / before) counts at "
                                             "most this much", unit="x", gate=UPPER, lo=1.0)


# -- requests of every protocol, one frame ---------------------------------------------------------

_REQ_SCHEMA = {
    "protocol": pl.String, "client": pl.String, "client_port": pl.UInt16, "server": pl.String,
    "server_port": pl.UInt16, "operation": pl.String, "resource": pl.String, "key_resource": pl.String,
    "request_frame": pl.UInt32, "request_ts_ns": pl.Int64, "response_ts_ns": pl.Int64,
    "latency_ns": pl.Int64, "is_error": pl.Boolean, "answered": pl.Boolean, "counts": pl.Boolean,
    "ttl": pl.Int64, "expects": pl.Boolean, "failed": pl.Boolean, "end_ts_ns": pl.Int64,
}


def requests_of(frames: dict[str, pl.DataFrame], keep: tuple[str, ...] = ()) -> pl.DataFrame:
    """The TRANSACTION_COMMON part of every transaction frame, plus ``key_resource`` (what "the same
    request" means: DNS names compared case-insensitively, Kerberos by principal asked for), ``counts``
    (False for the later steps of one Kerberos login and for requests that expect no answer: LDAP
    unbind/abandon, ...), ``ttl`` (DNS answer TTL, s), ``expects`` (an answer is expected),
    ``failed`` (an error, or no answer where one was expected) and ``end_ts_ns`` (when the request
    stopped being outstanding: its answer, itself when none is expected, null when unanswered).
    Columns named in ``keep`` are passed through (every frame must have them)."""
    parts = []
    for name, f in frames.items():
        cols = set(f.columns)
        resource = pl.col("resource").cast(pl.String)
        key = resource
        counts = pl.lit(True)
        ttl = pl.lit(None, pl.Int64)
        if name.startswith("dns") or "qtype" in cols:
            key = via_unique(resource, f, "_res", pl.col("_res").str.to_lowercase(), pl.String)
        if {"sname", "realm"} <= cols:
            principal = pl.concat_str(pl.col("sname").cast(pl.String), pl.lit("@"), pl.col("realm").cast(pl.String))
            resource = pl.coalesce(principal, resource)
            key = resource
        if "login_step" in cols:
            counts = pl.col("login_step").fill_null(1) <= 1
        if "answer_ttl_min" in cols:
            ttl = pl.col("answer_ttl_min").cast(pl.Int64)
        expects = pl.col("expects_response").cast(pl.Boolean).fill_null(True) if "expects_response" in cols \
            else pl.lit(True)
        parts.append(f.select(
            pl.col("protocol").cast(pl.String), pl.col("client").cast(pl.String),
            pl.col("client_port").cast(pl.UInt16), pl.col("server").cast(pl.String),
            pl.col("server_port").cast(pl.UInt16), pl.col("operation").cast(pl.String).fill_null(""),
            resource.alias("resource"), key.fill_null("").alias("key_resource"),
            pl.col("request_frame").cast(pl.UInt32), pl.col("request_ts_ns").cast(pl.Int64),
            pl.col("response_ts_ns").cast(pl.Int64), pl.col("latency_ns").cast(pl.Int64),
            pl.col("is_error").cast(pl.Boolean), pl.col("answered").cast(pl.Boolean).fill_null(False),
            (counts & expects).alias("counts"), ttl.alias("ttl"), expects.alias("expects"),
            (pl.col("is_error").cast(pl.Boolean).fill_null(False)
             | (expects & ~pl.col("answered").cast(pl.Boolean).fill_null(False))).alias("failed"),
            pl.when(expects).then(pl.col("response_ts_ns").cast(pl.Int64))
            .otherwise(pl.col("request_ts_ns").cast(pl.Int64)).alias("end_ts_ns"),
            *keep,
        ).filter(pl.col("request_ts_ns").is_not_null() & pl.col("client").is_not_null()
                 & pl.col("server").is_not_null()))
    if not parts:
        return pl.DataFrame(schema=_REQ_SCHEMA)
    return pl.concat([p.cast(_REQ_SCHEMA) for p in parts], how="diagonal_relaxed" if keep else "vertical")


# -- the segment search: detectors/herd_search.py ------------------------------------------------

def _with_keys(req: pl.DataFrame) -> pl.DataFrame:
    if "key_operation" not in req.columns:
        req = req.with_columns(pl.col("operation").alias("key_operation"), pl.col("resource").alias("named"),
                               pl.lit(False).alias("dir_row"), pl.lit(False).alias("fs_row"),
                               pl.lit(False).alias("setup_row"))
    return req.with_columns(row_wise(
        req, pl.concat_str("protocol", "server", "key_operation", "key_resource", separator="\x1f").hash()).alias("key"))


def _episodes(req: pl.DataFrame, params: Params, t_first: int, t_last: int) -> pl.DataFrame:
    """Herd episodes: key, seg, start_ns, end_ns, clients, arrivals, lam (per ns), baseline (per s).
    ``req`` has the ``_arrival`` marks of :func:`_sessions`."""
    # integers only until the segments are known (sorting strings is what costs); the arrivals (a
    # client's first request of the key after a gap of repeat_ns) are the sessions' first requests
    arrivals = (
        req.lazy().with_row_index("_row").filter(pl.col("_arrival"))  # lazy: only these columns are filtered
        .select("_row", "key", pl.col("client_id").hash().alias("cid"), "request_ts_ns")
        .sort("key", "request_ts_ns").collect()
    )
    # a key needs min_clients distinct arrivals somewhere to hold a herd; baseline: the key's median
    # arrivals per bin over the bins from its first to its last arrival (empty bins included; a key
    # busy only part of the capture is judged on that part; over fewer than baseline_min_bins, none:
    # the burst itself)
    bin_ns = max(int(params.baseline_bin_ns), 1)
    enough, median_bin = key_baselines(arrivals["key"].to_numpy(), arrivals["request_ts_ns"].to_numpy(),
                                       int(params.min_clients), bin_ns, int(params.baseline_min_bins))
    arrivals = arrivals.with_columns(pl.Series("median_bin", median_bin)).filter(pl.Series(enough))
    if arrivals.height == 0:
        return pl.DataFrame()
    floor = params.min_clients / max(params.window_ns, 1)
    arrivals = arrivals.with_columns((pl.col("median_bin") * (S / bin_ns)).alias("baseline_rate")).with_columns(
        pl.max_horizontal(pl.lit(floor), pl.col("baseline_rate") * params.rate_factor / S).alias("lam"),
        pl.col("key").cast(pl.UInt64).reinterpret(signed=True).alias("grp"),
    ).select("_row", "key", "cid", "request_ts_ns", "lam", "baseline_rate", "grp")
    arrivals = herd_segments(arrivals, params)
    rows = arrivals["_row"]  # the clients of the arrivals by position (a join would hash every request)
    arrivals = arrivals.hstack(req.select(pl.col(c).gather(rows) for c in ("client_id", "client", "client_identity")))
    eps = (arrivals.group_by("seg").agg(
        pl.col("key").first(), pl.col("request_ts_ns").min().alias("start_ns"),
        pl.col("request_ts_ns").max().alias("end_ns"), pl.col("client_id").n_unique().alias("clients"),
        pl.len().alias("arrivals"), pl.col("lam").first(), pl.col("baseline_rate").first(),
        pl.col("_row").alias("arrival_rows"),
        pl.col("client").n_unique().alias("addresses"),
        pl.col("client_id").filter(pl.col("client_identity") == "address+port").n_unique().alias("split_clients"),
        pl.col("client").filter(pl.col("client_identity") == "address+port").n_unique().alias("split_addresses"),
        pl.col("client").filter(pl.col("client_identity") == "address+port").min().alias("one_split_address"),
    ).filter((pl.col("clients") >= params.min_clients)
             & (pl.col("end_ns") - pl.col("start_ns") <= params.max_span_ns)))
    return eps.sort("start_ns", "key")


# -- the report ------------------------------------------------------------------------------------

def _server_stats(req: pl.LazyFrame, eps: pl.DataFrame, params: Params) -> pl.DataFrame:
    """Per episode: the server's (same protocol; set-up requests apart from the others) p99 latency and
    failure share during (from its first arrival to its last request, ``busy_end_ns``) and before.

    "Before" is the ``lookback_ns`` before the first of the server's herds that overlap this one
    (a run of herds that overlap in time, such as the AS and then the TGS requests of the same
    logins): the requests of an overlapping herd are not the server's normal latency, and where one
    herd ends and the next begins must not decide what is "before". The baseline (p99, failure
    share) is the lower of the lookback's with and without the other herds' requests: an earlier
    herd must not inflate it, and leaving out a burst that only a looser setting calls a herd must
    not hide a rise (lowering a threshold never downgrades a finding). One sorted pass per server (window
    bounds by binary search), never a join of every episode with every request; the requests' columns
    it reads are sorted once into one frame, each server a slice of it (7.2M requests, the 10M synth
    capture's DNS server ten times: each further copy was ~335 MB)."""
    runs = (eps.filter(pl.col("clients") > 1).select("seg", "protocol", "server", "start_ns", "end_ns")
            .sort("protocol", "server", "start_ns", "seg")
            .with_columns((pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).over("protocol", "server"))
                          .fill_null(True).cum_sum().alias("_run"))
            .select("seg", pl.col("start_ns").min().over("_run").alias("_run_start")))
    # "during": from the herd's first arrival to its last request (its arrivals' repeats included)
    busy = pl.max_horizontal("end_ns", "busy_end_ns") if "busy_end_ns" in eps.columns else pl.col("end_ns")
    # a herd of work requests is measured against the server's work requests, a herd of set-up requests
    # (a mount storm: SETCLIENTID, EXCHANGE_ID ...) against its set-up requests: a set-up operation's own
    # latency (a state write) is not the work's (protocols that declare set-up operations, herd_files.py)
    setup = pl.col("is_setup").fill_null(False) if "is_setup" in eps.columns else pl.lit(False)
    e = (eps.select("seg", "protocol", "server", "start_ns", busy.alias("_during_end"), setup.alias("_setup"))
         .join(runs, on="seg", how="left")
         .with_columns(pl.coalesce("_run_start", "start_ns").alias("_before_end")))
    by = ["protocol", "server", "_setup"]
    req = req.with_columns(pl.col("setup_row").fill_null(False).alias("_setup"))
    # the groups numbered, so that the one sort is of integers (a sort by text costs several times more)
    groups = req.select(by).unique().collect().with_row_index("_g")
    srv = (req.join(groups.lazy(), on=by).select("_g", *window_columns(), "in_herd")
           .sort("_g", "request_ts_ns").collect())
    bounds = srv.with_row_index("_i").group_by("_g").agg(pl.col("_i").min(), pl.len()).join(groups, on="_g")
    slices = {(p, s, setup): (start, n) for p, s, setup, start, n in bounds.select(*by, "_i", "len").iter_rows()}
    parts = []
    for key, ge in e.group_by(by):
        if key not in slices:
            continue
        g = srv.slice(*slices[key])
        arrays = tuple(g[c].to_numpy() for c in WINDOW_COLUMNS)
        quiet = ~g["in_herd"].to_numpy()
        cols = {"seg": ge["seg"].to_numpy()}
        cols |= stats_columns(arrays, ge["start_ns"].to_numpy(), ge["_during_end"].to_numpy(), "right", "during")
        b_end = ge["_before_end"].to_numpy()
        cols |= stats_columns(tuple(a[quiet] for a in arrays), b_end - int(params.lookback_ns), b_end,
                              "left", "before")
        cols |= stats_columns(arrays, b_end - int(params.lookback_ns), b_end, "left", "before_all")
        parts.append(pl.DataFrame(cols))
    schema = {"seg": eps.schema["seg"], "p99_during": pl.Float64, "fail_during": pl.Float64,
              "answered_during": pl.Int64, "n_during": pl.Int64, "p99_before": pl.Float64,
              "fail_before": pl.Float64, "answered_before": pl.Int64, "n_before": pl.Int64,
              "p99_before_all": pl.Float64, "fail_before_all": pl.Float64, "answered_before_all": pl.Int64,
              "n_before_all": pl.Int64}
    stats = (pl.concat([p.cast({k: schema[k] for k in p.columns}) for p in parts]) if parts
             else pl.DataFrame(schema=schema))
    # an empty window has no statistics (null, as for a server without requests)
    def kept(c: str, n: str) -> pl.Expr:
        value = pl.col(c).fill_nan(None) if schema[c] == pl.Float64 else pl.col(c)
        return pl.when(pl.col(n) > 0).then(value).alias(c)

    stats = stats.with_columns(
        *[kept(c, "n_during") for c in ("p99_during", "fail_during", "answered_during", "n_during")],
        *[kept(c, "n_before") for c in ("p99_before", "fail_before", "n_before")],
        *[kept(c, "n_before_all") for c in ("p99_before_all", "fail_before_all", "n_before_all")],
    ).select(  # the lower of the two baselines (see above)
        "seg", "p99_during", "fail_during", "answered_during", "n_during",
        pl.min_horizontal("p99_before", "p99_before_all").alias("p99_before"),
        pl.min_horizontal("fail_before", "fail_before_all").alias("fail_before"),
        pl.max_horizontal("n_before", "n_before_all").alias("n_before"))
    return eps.join(stats, on="seg", how="left")


_HIT_COLUMNS = ("_rid", "key", "request_frame", "request_ts_ns", "counts", "named", "client_id", "dir_row",
                "operation")


def _evidence(req: pl.DataFrame, eps: pl.DataFrame) -> pl.DataFrame:
    """Per episode: every request of its key inside its span, and every request of its arrivals'
    sessions (a client's repeats right after the span are the herd's too): the evidence frames and
    the in_herd marks."""
    e = eps.select("seg", "key", "start_ns", "end_ns")
    span = req.select(*_HIT_COLUMNS).join(e, on="key", how="inner").filter(
        pl.col("request_ts_ns").is_between(pl.col("start_ns"), pl.col("end_ns"))).select("seg", *_HIT_COLUMNS)
    return pl.concat([span, _arrival_requests(req, eps).select("seg", *_HIT_COLUMNS)]).unique(
        ["seg", "_rid"], keep="first").sort("seg", "request_ts_ns", "_rid")


def _sessions(req: pl.DataFrame, params: Params) -> pl.DataFrame:
    """``_session`` per counted request: an arrival and its repeats (the client's requests of the
    key until a gap of ``repeat_ns``) share one; null for requests that do not count. ``_arrival``:
    the request opens its session (the arrivals :func:`_episodes` searches)."""
    window = int(params.repeat_ns)
    new = (((pl.col("request_ts_ns") - pl.col("request_ts_ns").shift(1)) >= window).fill_null(True)
           | (pl.col("key") != pl.col("key").shift(1)).fill_null(True)
           | (pl.col("cid") != pl.col("cid").shift(1)).fill_null(True))
    # integers only (sorting strings is what costs); the session numbers are put back in row order by
    # position (a join and a sort of the whole frame would cost more than the search)
    sess = (req.lazy().with_row_index("_r").filter(pl.col("counts"))
            .select("_r", "key", pl.col("client_id").hash().alias("cid"), "request_ts_ns").collect()
            .sort("key", "cid", "request_ts_ns", "_r").select("_r", new.alias("_arrival"))
            .with_columns(pl.col("_arrival").cum_sum().alias("_session")))
    rows = sess["_r"]
    session = pl.Series("_session", [None], dtype=sess.schema["_session"]).extend_constant(None, req.height - 1)
    arrival = pl.Series("_arrival", [False]).extend_constant(False, req.height - 1)
    return req.with_columns(session.scatter(rows, sess["_session"]), arrival.scatter(rows, sess["_arrival"]))


def _arrival_requests(req: pl.DataFrame, eps: pl.DataFrame) -> pl.DataFrame:
    """Per episode (``seg``): every request of its arrivals' sessions (an arrival and its repeats),
    with what it names."""
    rows = req.with_row_index("_row").select("_row", "_session")
    arr = (eps.select("seg", "arrival_rows").explode("arrival_rows")
           .join(rows, left_on="arrival_rows", right_on="_row", how="inner").select("seg", "_session"))
    return req.select("_session", *_HIT_COLUMNS).filter(pl.col("_session").is_not_null()).join(
        arr, on="_session", how="inner")


def _verb(protocol: str, operation: str, ttl: bool) -> str:
    """How the sentence says the clients sent their requests, from the protocol's declaration
    (request_verb / repeat_verb / plural_operations, analyzer/decoders/protocol.py)."""
    p = protocol_declaration(protocol)
    if p is not None and p.request_verb:
        return p.repeat_verb if ttl and p.repeat_verb else p.request_verb
    if p is not None and operation in p.plural_operations:
        return f"sent {operation}s for"
    return f"sent {operation} for" if operation else "asked for"


def _explain(r: dict, res_ns: float) -> str:
    span = r["end_ns"] - r["start_ns"]
    if span < res_ns:
        within = f"within {fmt_ns(res_ns)} (the capture's timestamp resolution)"
    else:
        within = f"within {fmt_limited(span, res_ns)}"
    proto, op = r["protocol"], r["operation"] or ""
    what = r["resource"] or op or "the same request"
    declared = protocol_declaration(proto)
    if declared is not None and declared.operation_after_resource and op:
        what = f"{what} {op}"
    verb = _verb(proto, op, r['ttl_s'] is not None)
    if r.get("is_fs") or r.get("is_setup"):
        verb, what = fs_words(r, declared)
    head = " ".join(w for w in (f"{r['clients']} clients", verb, what, f"at {r['server']} {within}") if w)
    if r["ttl_s"] is not None:
        share = f"; {r['ttl_share'] * 100:.0f} % of them right when their own cached answer expired" \
            if r["ttl_share"] is not None else ""
        # the span is how long the herd lasted, not how close to the expiry it came: say them apart
        trigger = f", when its TTL ran out (TTL {r['ttl_s']} s{share})"
    elif r["failures_before"]:
        trigger = (f", right after {r['failures_before']} failed or unanswered request(s) for it in the "
                   f"preceding {fmt_ns(r['failures_since_ns'])} (clients coming back together after a failure)")
    elif r["sync_ms"] is not None:
        trigger = (f", starting {r['sync_ms']:+.1f} ms from a whole second (a synchronised start: "
                   f"timer- or cron-driven clients)")
    else:
        trigger = ""
    rate = r["arrivals"] / max(span, res_ns) * S
    if r["baseline_outside"] > 0:
        factor = rate / r["baseline_outside"]
        rate_s = (f"; {fmt_number(rate)}/s against {fmt_number(r['baseline_outside'])}/s otherwise "
                  f"({fmt_number(factor) if factor < 1000 else 'over 1,000'}x)")
    else:
        rate_s = f"; {fmt_number(rate)}/s, and no other requests for it in the capture"
    if r["p99_during"] is None and not r["answers_seen"]:
        lat = "; the server's responses are not in the capture (one direction only?), so its latency cannot be judged"
    elif r["p99_during"] is None:
        lat = f"; the server answered none of them ({r['fail_during'] * 100:.0f} % failures during the herd)"
    elif r["p99_before"] is None:
        lat = (f"; server p99 latency {fmt_limited(r['p99_during'], res_ns)} and "
               f"{r['fail_during'] * 100:.0f} % failures "
               f"during the herd (no earlier requests to compare)")
    else:
        verb = "rose" if r["p99_during"] > r["p99_before"] else "went"
        lat = (f"; server p99 latency {verb} from {fmt_limited(r['p99_before'], res_ns)} to "
               f"{fmt_limited(r['p99_during'], res_ns)}, "
               f"failures {r['fail_before'] * 100:.0f} % -> {r['fail_during'] * 100:.0f} %")
    lat += streams_text(r["clients"], r["split_clients"], r["split_addresses"], r["one_split_address"])
    if r["clients"] <= 1:
        lat += "; all of it is one request stream (one client, one port), not a herd (informational)"
    if not r["judged"]:
        lat += ("; the capture is too short around it to know the normal rate, so this may be ordinary "
                "load (informational)")
    return head + trigger + rate_s + lat


def streams_text(clients: int, split_clients: int, split_addresses: int, one_address: str | None) -> str:
    """How many of the clients are concurrent request streams of one address (told apart by port)."""
    if not split_clients:
        return ""
    where = "one address" if split_addresses == 1 else f"{split_addresses} addresses"
    text = f"; {split_clients} concurrent streams from {where} (processes, containers or NAT)"
    if split_addresses == 1 and one_address:
        text += f": {one_address}"
    if split_clients < clients:
        text += f", the other {clients - split_clients} clients distinct addresses"
    return text


def _observed_period(capture, req: pl.DataFrame) -> tuple[int, int]:
    """First and last timestamp the capture covers (its packets; the requests when it has none)."""
    lo, hi = int(req["request_ts_ns"].min()), int(req["request_ts_ns"].max())
    try:
        ts = capture.packets["ts_ns"]
        if ts.len():
            lo, hi = min(lo, int(ts.min())), max(hi, int(ts.max()))
    except (AttributeError, KeyError, pl.exceptions.ColumnNotFoundError):
        pass
    return lo, hi


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    frames = transaction_frames(capture)
    req = requests_of(frames)
    if req.height < params.min_clients:
        return empty_findings()
    req = client_identity_by(req, ["protocol", "server"], end="end_ts_ns")
    fs = fs_protocols(frames)
    req = _sessions(_with_keys(fs_keyed(req, fs) if fs else req), params).with_row_index("_rid")
    t_first, t_last = _observed_period(capture, req)
    eps = _episodes(req, params, t_first, t_last)
    if eps.height == 0:
        return empty_findings()
    res_ns = resolution_ns(capture)
    keyinfo = (req.lazy().filter(pl.col("key").is_in(eps["key"].implode()))
               .group_by("key").agg(pl.col("protocol").first(), pl.col("server").first(),
                                    pl.col("operation").first(), pl.col("resource").mode().sort().first(),
                                    pl.col("key_resource").first(), pl.col("fs_row").first().alias("is_fs"),
                                    pl.col("setup_row").first().alias("is_setup"),
                                    pl.col("counts").sum().alias("key_requests")).collect())
    eps = eps.join(keyinfo, on="key", how="left").with_columns(
        pl.when(pl.col("split_clients") * 2 > pl.col("clients")).then(pl.lit("address+port"))
        .otherwise(pl.lit("address")).alias("client_identity"))
    hits = _evidence(req, eps)
    ev = hits.group_by("seg").agg(pl.col("request_frame").unique().sort().alias("evidence_frames"),
                                  pl.len().alias("in_span"), pl.col("request_ts_ns").max().alias("busy_end_ns"))
    # "outside its herds" and "before the herd, other herds left out" leave out herds of at least two
    # clients: an episode of one stream is not a herd (with min_clients=1 every request would be one,
    # and nothing would be left to compare with)
    herds = eps.filter(pl.col("clients") > 1)
    hits_of_herds = hits.join(herds.select("seg"), on="seg", how="semi")
    in_herd = hits_of_herds.select("request_frame", "request_ts_ns").unique().with_columns(
        pl.lit(True).alias("in_herd"))
    req = req.join(in_herd, on=["request_frame", "request_ts_ns"], how="left").with_columns(
        pl.col("in_herd").fill_null(False))
    # the key's rate outside its herds
    herd_time = herds.group_by("key").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("herd_ns"))
    herd_reqs = hits_of_herds.group_by("key").agg(pl.col("counts").sum().alias("herd_requests"))
    duration = max(t_last - t_first, 1)
    eps = (eps.join(ev, on="seg", how="left").join(herd_time, on="key", how="left")
           .join(herd_reqs, on="key", how="left")
           .with_columns(pl.col("herd_ns").fill_null(0), pl.col("herd_requests").fill_null(0))
           .with_columns(((pl.col("key_requests") - pl.col("herd_requests")).clip(0)
                          / ((duration - pl.col("herd_ns")).clip(1) / S)).alias("baseline_outside"),
                         (duration - pl.col("herd_ns")).alias("outside_ns"),
                         (pl.col("arrivals") / pl.max_horizontal(pl.col("end_ns") - pl.col("start_ns"), pl.lit(res_ns))
                          * S).alias("herd_rate")))
    # short relative to the key's normal rate: against its rate outside its herds, when the capture
    # shows enough of that (at least as long as the herd and the window); otherwise it cannot judge
    eps = eps.with_columns(
        (pl.col("outside_ns") >= pl.max_horizontal(pl.col("end_ns") - pl.col("start_ns"),
                                                    pl.lit(int(params.window_ns)))).alias("judged"),
    ).filter(~pl.col("judged") | (pl.col("herd_rate") >= params.rate_factor * pl.col("baseline_outside")))
    if eps.height == 0:
        return empty_findings()
    eps = eps.join(fs_names(hits), on="seg", how="left")
    eps = one_per_tree(eps, params.nested_share)
    # the server's statistics: each request once (not its directory's copy)
    eps = _server_stats(req.lazy().filter(~pl.col("dir_row")), eps, params)
    answering = req.select(pl.col("protocol").filter(pl.col("answered")).unique()).with_columns(
        pl.lit(True).alias("answers_seen"))
    eps = eps.join(answering, on="protocol", how="left").with_columns(pl.col("answers_seen").fill_null(False))
    eps = eps.join(ttl_trigger(req, eps, params), on="seg", how="left")
    eps = eps.join(failure_trigger(req, eps, params), on="seg", how="left")
    sync_ok = res_ns * RESOLUTION_TICKS <= params.sync_tolerance_ns
    frac = (pl.col("start_ns") % S)
    off_ms = pl.when(frac > S // 2).then(frac - S).otherwise(frac) / NS_PER_MS
    eps = eps.with_columns(
        pl.when(pl.lit(sync_ok) & (off_ms.abs() * NS_PER_MS <= params.sync_tolerance_ns)).then(off_ms)
        .otherwise(None).alias("sync_ms"),
        pl.col("failures_before").fill_null(0),
    )
    # severity: clients x latency factor, one level up for a rise in failures
    ratio = pl.col("p99_during") / pl.col("p99_before")
    lat_factor = (pl.when((ratio >= params.latency_factor)
                          & (pl.col("p99_during") - pl.col("p99_before") >= params.latency_floor_ns))
                  .then(ratio.clip(upper_bound=params.max_latency_factor)).otherwise(1.0).fill_null(1.0))
    impact = pl.col("clients").cast(pl.Float64) * lat_factor
    level = severity_from_scale(impact, (float(params.min_clients), float(params.medium_clients),
                                         params.high_impact, params.critical_impact))
    eps = eps.with_columns(impact.alias("impact"), level.alias("_sev")).with_columns(
        pl.when(pl.col("_sev") == "informational").then(pl.lit("low")).otherwise(pl.col("_sev")).alias("_sev"))
    bump = ((pl.col("fail_during") - pl.col("fail_before").fill_null(0.0)) >= params.error_rate_rise).fill_null(False)
    order = list(SEVERITIES)
    eps = eps.with_columns(
        pl.when(bump).then(pl.col("_sev").replace_strict({s: order[min(k + 1, len(order) - 1)]
                                                           for k, s in enumerate(order)}))
        .otherwise(pl.col("_sev")).alias("severity"))
    # concurrent streams of one address (processes, containers, NAT) are judged like distinct hosts:
    # only what is demonstrably one stream (one client: one port, or one connection's pipelined
    # requests) is not a herd, and a capture too short to know the normal rate cannot judge
    eps = eps.with_columns(
        pl.when(pl.col("judged") & (pl.col("clients") > 1)).then(pl.col("severity"))
        .otherwise(pl.lit("informational")).alias("severity"))
    rows = eps.sort("start_ns").to_dicts()
    expl = [_explain(r, res_ns) for r in rows]
    out = eps.sort("start_ns").with_columns(
        pl.Series("explanation", expl, dtype=pl.String),
        pl.col("protocol").alias("kind"),
        pl.lit(None, pl.String).alias("client"),
        pl.col("clients").cast(pl.UInt32),
        pl.lit("clients_in_window").alias("metric"),
        pl.col("clients").cast(pl.Float64).alias("value"),
        pl.lit(float(params.min_clients)).alias("threshold"),
        pl.lit("clients").alias("unit"),
        pl.col("evidence_frames").fill_null([]).list.eval(pl.element().cast(pl.UInt32)),
    ).select("kind", "severity", "start_ns", "end_ns", "client", "server", "resource", "clients",
             "client_identity", "metric", "value", "threshold", "unit", "evidence_frames", "explanation")
    return findings(out, detector=NAME, params=params)
