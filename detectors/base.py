"""The detector contract and what every detector shares.

A detector is a module in ``detectors/`` with:

- ``NAME``: its dotted name (``herd``, ``retry_storm``, ``tcp_stall`` ...), the ``detector`` column.
- a module docstring: the pathology, the signal measured, the references (RFC / spec sections), the
  known false positives, the severity rule.
- ``REQUIRES``: every capture frame it reads (``("dns_transactions", "connections", "interfaces")``;
  ``capture.packets`` is the frame ``packets``, :func:`resolution_ns` reads ``interfaces``). It is
  enforced: :func:`detectors.run` hands ``detect`` a :class:`CaptureView` that serves only these
  frames and raises :class:`UndeclaredFrame` for any other. What gets built is what the detectors
  actually read through their views (and what those frames are built from), which
  tests/test_detector_contract.py checks against :func:`detectors.required_frames`.
- ``COLUMNS`` (optional): of frames it REQUIRES, the columns it reads where it reads only some
  (``{"tcp_segments": ("conn", "frame", ...)}``). Enforced the same way: its view serves such a frame
  with those columns alone (reading another raises Polars' ColumnNotFoundError). A scan keeps of a
  frame only the columns its readers declare, once every one of them declares some
  (:func:`detectors.narrow_to_declared`; ``tcp_segments`` is ~112 B a segment in 22 columns).
- ``ROWS`` (optional): of frames it REQUIRES, the rows it reads where it reads only some, as a Polars
  expression over its columns (``retry_storm``: of ``dns_messages`` the re-sent queries). Enforced
  the same way: its view serves such a frame filtered to them (:func:`rows_among`). A shard of a
  server cut by client hands over no more of a frame than its readers' ROWS (below).
- ``ORDER`` (optional): where it runs and is listed (ascending; without one, after those with one).
- ``PARTITION`` (optional): ``"server"`` when its findings are the union of its findings on each
  server partition of the capture (``analyzer.partitions``: every packet to or from a set of servers,
  decoded alone; ``packets`` still the whole capture's ``frame``/``ts_ns``, so spans and rates are the
  capture's). ``scan --workers`` then runs it on the workers, beside the decoding, instead of on the
  merged frames; tests/test_partitions.py checks the union against the whole run on the samples.
  Of the whole capture's ``packets`` a partition holds only what spans and long silences need
  (``analyzer.kernels.silences``): the first and last times, and every silence (no packet from
  anyone) as long as the shortest a detector run there looks for, with the packets either side of
  it. Such a detector reads ``packets`` for nothing else, and names the parameter that is that
  length in ``SILENCE`` (``tcp_stall``: ``"capture_gap_ns"``, in ns).
  A detector whose findings need a few facts of the whole capture besides (which kinds were answered
  at all, a median over every server) runs in two steps: ``partial(capture, params)`` returns a dict
  of frames (its candidates and those facts, of the same columns on every partition), and
  ``finish(parts, capture, params)`` makes the findings of the parts concatenated over the partitions
  (reading of ``capture`` no more than ``interfaces``); its ``detect`` is ``finish(partial(...))``, so
  the whole run and the partitioned one are the same code (``retry_storm``; ``tcp_stall``, whose
  stalls that hold a silence of the whole capture wait on what the whole capture resumed with).
  ``SHARDS = True`` (optional, with ``"server"``): its findings are also the union of its findings on
  each set of whole connections of a server (it judges each connection alone: ``tcp_stall``), so a
  scan runs it on the shards of a server cut by client (``analyzer.shards``); it then
  reads only connection frames, ``packets`` and ``interfaces``. The other server detectors run on
  the shards' frames merged, so a shard hands over no more of ``tcp_segments`` than they read:
  ``UNCOVERED_SEGMENTS`` (optional, frame names) says a detector reads it only for the connections no
  TCP transaction of those frames covers (``saturation``, ``conn_churn``: the TCP turns of the
  connections no decoder counts).
  ``"client"`` when they are the union of its findings on each client bucket (every connection of a
  set of client addresses, ``analyzer.partitions.client_buckets``); it then reads only connection
  frames (``CONNECTION_FRAMES``) and ``interfaces``, and ``scan --workers`` runs it on the buckets.
- ``KINDS``: the values its findings' ``kind`` column takes.
- ``Params``: a frozen dataclass; every threshold and window is a field declared with
  :func:`detectors.params.param` (default, meaning, unit, range, and whether it is a lower or upper
  bound on what gates a finding); ``--set herd.min_clients=50``, ``herdscope.toml`` and the dashboard
  override them by name, ``herdscope detectors`` lists them.
- ``detect(capture, params) -> pl.DataFrame``: pure; returns findings (``FINDING_COLUMNS``) built with
  :func:`findings`, never raises on odd input (an empty frame means "nothing to report").

Three facts of real captures every detector respects (helpers below):
- **A client is not always an address** (processes on one node, NAT, containers, loopback): where one
  address runs independent request streams concurrently from several ports or connections, those are
  distinct clients. :func:`client_identity_by` decides it per address (within a group, e.g. per
  server) and says which way was used; :func:`client_identity` is the same rule over the whole capture.
- **One vantage point**: a capture may miss a direction (the ``connections`` frame's client_packets
  and server_packets say which); a detector that cannot judge reports ``informational`` with the
  reason instead of guessing.
- **Timestamp resolution**: :func:`resolution_ns` is the capture's tick; never claim a window
  shorter than it (:func:`at_least_resolution`) and say so when it limits a finding.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from typing import Iterable

import polars as pl

from analyzer.durations import fmt_limited, fmt_ns  # noqa: F401 - the detectors' wording helpers
from analyzer.decoders import registry
from analyzer.decoders.protocol import Protocol

from .client_streams import split_rows

SEVERITIES = ("informational", "low", "medium", "high", "critical")
SEVERITY = pl.Enum(list(SEVERITIES))
SEVERITY_RANK = {s: k for k, s in enumerate(SEVERITIES)}
NS_PER_MS = 1e6  # unit conversions: the findings' values in ms or s from ns timestamps
NS_PER_S = 1e9
EVIDENCE_CAP = 50  # evidence frame numbers kept per finding (evidence_total says how many there were)
# the cap in force: `herdscope show` lifts it (None) for the one finding it prints in full
_evidence_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar("evidence_cap", default=EVIDENCE_CAP)


@contextlib.contextmanager
def uncapped_evidence():
    """Within this block, findings keep every evidence frame (``evidence_total`` of them)."""
    token = _evidence_cap.set(None)
    try:
        yield
    finally:
        _evidence_cap.reset(token)


def evidence_cap() -> int | None:
    """The evidence frame numbers a finding keeps now: :data:`EVIDENCE_CAP`, or None (all of them)
    inside :func:`uncapped_evidence`."""
    return _evidence_cap.get()

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
    "evidence_frames": (pl.List(pl.UInt32), f"Wireshark frame numbers of the evidence, at most {EVIDENCE_CAP} (all of them in `herdscope show`)"),
    "evidence_total": (pl.UInt32, "how many evidence frames there were before capping"),
    "explanation": (pl.String, "one sentence with the numbers and the likely cause"),
    "parameters": (pl.String, "the detector's parameters as JSON"),
    # populations (detectors/population.py): many findings of one cause at one service, or across the fleet
    "members": (pl.UInt32, "a population finding: how many member findings it stands for; 0 for an ordinary finding"),
    "member_ids": (pl.List(pl.String), "a population finding: its members' finding_ids, worst first; empty otherwise"),
    "member_of": (pl.String, "a member finding: the finding_id of its population (listed only with --expand, "
                             "not counted by --fail-on); null otherwise"),
}
# what a detector's findings carry in the population columns until detectors/population.py groups them
FINDING_DEFAULTS = {"members": 0, "member_ids": [], "member_of": None}
FINDINGS_SCHEMA = pl.Schema({k: v[0] for k, v in FINDING_COLUMNS.items()})


def empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema=FINDINGS_SCHEMA)


def params_json(params) -> str:
    from .params import to_jsonable

    return json.dumps(to_jsonable(params), sort_keys=True)


def stable_id(parts: Iterable) -> str:
    """A finding's 16-hex-digit id from the values that identify it (the same values, the same id on
    every run: a BLAKE2b digest of them, None as the empty string)."""
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
            out = out.with_columns(pl.lit(FINDING_DEFAULTS.get(name), dtype=dtype).alias(name))
    out = out.with_columns(
        pl.col("evidence_frames").list.unique().list.sort().alias("evidence_frames"),
    ).with_columns(
        pl.col("evidence_frames").list.len().cast(pl.UInt32).alias("evidence_total"),
        pl.col("evidence_frames").list.head(evidence_cap() or 2**31).alias("evidence_frames"),
        pl.lit(params_json(params)).alias("parameters"),
        *significant_floats(),
    )
    ids = [stable_id(r) for r in out.select(*ID_PARTS).iter_rows()]
    out = out.with_columns(pl.Series("finding_id", _distinct_ids(out, ids)))
    return out.select(pl.col(n).cast(t) for n, t in FINDINGS_SCHEMA.items())


ID_PARTS = ("detector", "kind", "client", "server", "resource", "start_ns", "metric")
# a finding's float columns carry this many significant digits: the last bits of a float depend on how
# the engine evaluated it (Polars divides a column of two rows or more by a constant as a multiplication
# by its reciprocal, one row exactly: 46953000 ns / 1e6 is 46.952999999999996 or 46.953), and a finding is
# the same however many rows its frames had (scan --partitions, --workers)
SIGNIFICANT_DIGITS = 12


def significant_floats() -> list[pl.Expr]:
    """The findings' float columns held to :data:`SIGNIFICANT_DIGITS` (findings(), population findings)."""
    return [pl.col(n).cast(pl.Float64).round_sig_figs(SIGNIFICANT_DIGITS)
            for n, (dtype, _) in FINDING_COLUMNS.items() if dtype == pl.Float64]


def _distinct_ids(out: pl.DataFrame, ids: list[str]) -> list[str]:
    """``ids``, with findings that share one (same id parts) told apart by what else they say
    (end, value, explanation, evidence), never by row order: the same id in every run."""
    if len(set(ids)) == len(ids):
        return ids
    seen: dict[str, list[int]] = {}
    for k, i in enumerate(ids):
        seen.setdefault(i, []).append(k)
    ids = list(ids)
    for i, rows in seen.items():
        if len(rows) < 2:
            continue
        more = out[rows].select("end_ns", "value", "explanation", pl.col("evidence_frames").cast(pl.List(pl.String))
                                .list.join(",")).rows()
        order = sorted(range(len(rows)), key=lambda k: tuple("" if x is None else str(x) for x in more[k]))
        for n, k in enumerate(order):
            ids[rows[k]] = stable_id((i, *more[k], n))
    return ids


def severity_from_scale(value: pl.Expr, steps: tuple[float, float, float, float]) -> pl.Expr:
    """Severity by thresholds on an impact measure: below steps[0] informational, then low, medium,
    high, and critical at or above steps[3]."""
    return (pl.when(value >= steps[3]).then(pl.lit("critical"))
            .when(value >= steps[2]).then(pl.lit("high"))
            .when(value >= steps[1]).then(pl.lit("medium"))
            .when(value >= steps[0]).then(pl.lit("low"))
            .otherwise(pl.lit("informational")))


# -- what a detector sees of the capture ------------------------------------------------------------

def view(capture, module) -> "CaptureView":
    """The view of ``capture`` a detector module (or the population step) reads through: its REQUIRES,
    COLUMNS and ROWS."""
    return CaptureView(capture, module.NAME, module.REQUIRES, getattr(module, "COLUMNS", None),
                       getattr(module, "ROWS", None))


def rows_among(frame: pl.DataFrame, rows: pl.Expr) -> pl.DataFrame:
    """The rows of ``frame`` a detector's ``ROWS`` declares (``rows``); all of them when the frame lacks a
    column the expression reads (a frame of another shape, which its reader tells apart itself)."""
    return frame.filter(rows) if set(rows.meta.root_names()) <= set(frame.columns) else frame


class UndeclaredFrame(RuntimeError):
    """A detector (or the population step) read a frame its ``REQUIRES`` does not declare: a bug of its
    declaration. Not a KeyError (that means "this capture has no such frame" and is tolerated)."""


# The columns of ``packets`` a detector sees: its span and silences need no more, and a scan keeps only
# these once its detectors' frames are built (Capture.release: the whole frame is ~90 B per packet).
PACKET_COLUMNS = ("frame", "ts_ns")


class CaptureView:
    """The capture as one detector sees it: :meth:`frame` (and :attr:`packets`, the frame
    ``packets``) serve only the frames in ``requires``; anything else is :class:`UndeclaredFrame`,
    naming the detector and the frame; of ``packets`` only :data:`PACKET_COLUMNS`. The frames are still built on first request, by the capture
    itself (a frame's own builder reads what it needs from the capture, not through the view), so
    running only some detectors builds only their frames and what those are built from.

    A few read-only facts of the capture pass through unchanged (:data:`PASS_THROUGH`: its path,
    files and pieces, warnings, and which file a frame number is in); anything else, such as the raw
    bytes, the builders' shared cache (``memo``: a detector could overwrite it and break later
    frames), setting or listing frames, is not a detector's business (AttributeError)."""

    PASS_THROUGH = frozenset({"path", "files", "pieces", "warnings", "frames_by_file"})

    def __init__(self, capture, detector: str, requires: Iterable[str],
                 columns: dict[str, tuple[str, ...]] | None = None, rows: dict[str, pl.Expr] | None = None):
        self._capture = capture
        self.detector = detector
        self.requires = frozenset(requires)
        self.columns = dict(columns or {})  # frame -> the only columns served of it (the detector's COLUMNS)
        self.rows = dict(rows or {})  # frame -> the only rows served of it (the detector's ROWS)

    def frame(self, name: str) -> pl.DataFrame:
        self._check(name)
        if name == "packets":
            return self._capture.packets.select(PACKET_COLUMNS)
        frame = self._capture.frame(name)
        if name in self.rows:
            frame = rows_among(frame, self.rows[name])
        return frame.select(self.columns[name]) if name in self.columns else frame

    def _check(self, name: str) -> None:
        if name not in self.requires:
            raise UndeclaredFrame(
                f"detector {self.detector!r} read the frame {name!r}, which its REQUIRES does not declare "
                f"(declared: {', '.join(sorted(self.requires)) or 'nothing'}); add {name!r} to "
                f"{self.detector}.REQUIRES")

    @property
    def packets(self) -> pl.DataFrame:
        return self.frame("packets")

    def __getattr__(self, name: str):
        if name in CaptureView.PASS_THROUGH and "_capture" in self.__dict__:
            return getattr(self.__dict__["_capture"], name)
        raise AttributeError(f"detector {self.__dict__.get('detector')!r}: a detector reads frames through "
                             f"frame(name) (and packets), not {name!r}")

    def __repr__(self) -> str:
        return f"CaptureView({self._capture!r}, {self.detector!r}, {sorted(self.requires)}, {self.columns!r})"


# -- capture facts ----------------------------------------------------------------------------------

# Intervals within this many ticks of the timestamp resolution are too coarse to read a timer's shape or
# an RTT multiple from (retry_storm does not classify their backoff; tcp_stall and herd say so).
RESOLUTION_TICKS = 10


def resolution_ns(capture) -> float:
    """The coarsest timestamp tick among the capture's interfaces that carry packets, in ns: the
    *effective* tick inferred from the timestamps (``effective_resolution_ns``, see
    analyzer/resolution.py: a ns-magic file stamped in 10 ms steps has a 10 ms tick), the declared
    one where the data cannot tell or the frame lacks the column (1000 for µs pcap)."""
    from analyzer.resolution import capture_tick

    tick = capture_tick(capture.frame("interfaces"))
    return 1000.0 if tick is None else tick


def at_least_resolution(window_ns: int, capture) -> tuple[int, bool]:
    """(window, limited): the window widened to the (effective) timestamp resolution when shorter."""
    res = resolution_ns(capture)
    return (int(max(window_ns, res)), window_ns < res)


def via_unique(col: pl.Expr, frame: pl.DataFrame, name: str, fn, dtype=pl.Int64) -> pl.Expr:
    """``fn`` (an expression on pl.col(name)) computed once per distinct value of ``col`` in ``frame``
    and mapped back: DNs, attribute lists, change lists and DNS names repeat (few distinct strings in
    100k rows; herd's case-folded DNS names of the 10M synth capture's DNS server at 10x, 46 among 7.2M:
    ~150 MB less than folding every row)."""
    u = frame.select(col.alias(name)).unique().drop_nulls()
    if u.height == 0:
        return pl.lit(None, dtype)
    m = u.with_columns(fn.alias("_v"))
    return col.replace_strict(m[name], m["_v"], default=None, return_dtype=dtype)


def client_identity_by(requests: pl.DataFrame, by: list[str], *, addr: str = "client",
                       port: str = "client_port", start: str = "request_ts_ns", end: str = "response_ts_ns",
                       timeout_ns: int = 1_000_000_000, name: str = "client_id") -> pl.DataFrame:
    """The one client-identity rule, decided per address within each group of ``by`` (e.g. per
    server), in one vectorised pass: ``requests`` (one row per request) with ``name`` (the client) and
    ``client_identity`` added, in the original row order.

    An address that has requests *outstanding at the same time* from different ports runs several
    independent request streams (processes on one node, NAT, containers): its clients are
    address:port ("address+port"). An address whose requests are sequential (each answered, or given
    up after ``timeout_ns``, before the next) is one client however many ports it uses (one
    resolver's habit of a new port per query): "address". ``end`` null means unanswered: outstanding
    for ``timeout_ns``; a request that expects no answer should be given ``end`` = ``start``.

    Per address (within ``by``) rather than per capture, so that one forwarder, NAT gateway or
    multi-process host does not turn every stub resolver of the capture into many clients.
    :func:`client_identity` is this rule with no grouping, as an expression. The overlap test walks
    integer columns (detectors/client_streams.py): sorting the requests themselves (strings and all)
    would cost several times more."""
    if requests.height == 0:
        return requests.with_columns(pl.lit(None, pl.String).alias(name),
                                     pl.lit(None, pl.String).alias("client_identity"))
    mask = split_rows(requests, by, addr, port, start, end, timeout_ns)
    ids = requests[addr].cast(pl.String).alias(name)
    if mask is None:
        return requests.with_columns(ids, pl.lit("address").alias("client_identity"))
    rows = mask.arg_true()  # address:port strings only where an address was split (few rows)
    picked = requests.select(pl.col(addr).cast(pl.String).alias("a"), pl.col(port).alias("p"))[rows]
    ids = ids.scatter(rows, picked.select(pl.format("{}:{}", "a", "p")).to_series())
    return requests.with_columns(
        ids, pl.when(mask).then(pl.lit("address+port")).otherwise(pl.lit("address")).alias("client_identity"))


def client_identity(requests: pl.DataFrame, *, addr: str = "client", port: str = "client_port",
                    start: str = "request_ts_ns", end: str = "response_ts_ns",
                    timeout_ns: int = 1_000_000_000) -> tuple[pl.Expr, str]:
    """:func:`client_identity_by` over the whole capture (no grouping), as an expression giving the
    client of a row (of ``requests`` or of any frame with the ``addr`` and ``port`` columns, e.g. the
    SMB2 break notifications of a client's transactions), and the name of the rule in force
    ("address+port" when some address was split, else "address")."""
    own = pl.col(addr).cast(pl.String)
    mask = split_rows(requests, [], addr, port, start, end, timeout_ns) if requests.height else None
    if mask is None:
        return own, "address"
    # of the requests only the split rows' addresses (a filter of the frame would copy every column)
    split = requests[addr].filter(mask).cast(pl.String).unique().sort()
    return (pl.when(own.is_in(split.implode())).then(pl.format("{}:{}", own, pl.col(port))).otherwise(own),
            "address+port")


def endpoint(addr: str, port) -> str:
    """``addr:port``, with an IPv6 address in brackets (``[2001:db8::1]:445``), as Wireshark writes it."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def endpoint_expr(addr: pl.Expr, port: pl.Expr) -> pl.Expr:
    """:func:`endpoint` as a Polars expression over address and port columns."""
    a = addr.cast(pl.String)
    return pl.when(a.str.contains(":")).then(pl.format("[{}]:{}", a, port)).otherwise(pl.format("{}:{}", a, port))


def fmt_number(x: float) -> str:
    """A measured number in a sentence: thousands separated from 100 up, one decimal from 10, two
    significant digits below (1,234 · 12.3 · 1.2 · 0.012)."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2g}"


def evidence(frames: pl.Expr) -> pl.Expr:
    """Aggregate frame numbers into the evidence list (use inside ``group_by().agg``)."""
    return frames.cast(pl.UInt32).unique().sort().alias("evidence_frames")


# -- shared by the transaction detectors (herd, retry_storm, ...) -----------------------------------

# The frames that start with analyzer.decoders.common.TRANSACTION_COMMON, one per protocol decoder, and
# the protocols they belong to (the ``kind`` of the transaction detectors' findings): derived from the
# protocol declarations (analyzer.decoders.registry) as they stand when detectors are imported.
TRANSACTION_FRAMES = registry.transaction_frames()
PROTOCOL_KINDS = tuple(p.name for p in registry.protocols() if p.transactions)


def protocol_declaration(name: str) -> Protocol | None:
    """The declaration of protocol ``name`` (its wording for sentences), None for "tcp" and others
    without a decoder."""
    return next((p for p in registry.protocols() if p.name == name), None)


def optional_frame(capture, name: str, *, nonempty: bool = False) -> pl.DataFrame | None:
    """The frame ``name`` of the capture, None when the capture has no such frame (KeyError: no
    decoder for it) and, with ``nonempty``, also when it has no rows."""
    try:
        frame = capture.frame(name)
    except KeyError:
        return None
    if nonempty and (frame is None or not frame.height):
        return None
    return frame


def transaction_frames(capture, names: Iterable[str] | None = None) -> dict[str, pl.DataFrame]:
    """name -> frame for every transaction frame this capture has (a decoder that is not installed
    is skipped) and that is not empty. ``names`` defaults to every registered protocol's transaction
    frame, read from the registry when called (a protocol registered later is included), and on a
    :class:`CaptureView` to those among them its detector declares (REQUIRES is read at import:
    a protocol registered after that is not the detector's, and reading it would be undeclared)."""
    if names is None:
        declared = getattr(capture, "requires", None)
        names = [n for n in registry.transaction_frames() if declared is None or n in declared]
    out = {}
    for name in names:
        frame = optional_frame(capture, name, nonempty=True)
        if frame is not None:
            out[name] = frame
    return out
