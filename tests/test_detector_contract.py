"""The detector contract (detectors/base.py, detectors/__init__.py): detectors are found, not listed;
each declares NAME, detect, Params, REQUIRES and KINDS; REQUIRES is complete and enforced (a detector
reads its frames through a view that serves only those); ``scan --detectors X`` builds only X's frames;
a new detector is its own module plus one registration."""
from __future__ import annotations

import importlib
import importlib.util
import json
import textwrap
import types
from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from analyzer.capture import FRAME_BUILDERS
from analyzer.cli import main
from detectors.base import CaptureView, UndeclaredFrame, client_identity, client_identity_by

SAMPLES = Path(__file__).parent.parent / "samples"
# today's run and listing order (ORDER), which `herdscope detectors` and scan's summary keep
DETECTORS = ["herd", "replay", "retry_storm", "smb_break_queue", "delegation_recall", "lock_polling", "saturation", "tcp_stall", "incast", "toctou", "replication_conflict",
             "conn_churn", "pfc_storm", "gbn_retransmission", "rnr_retry", "ecn_congestion"]
READER_FRAMES = {"packets", "tcp_sack", "icmp_errors", "interfaces"}  # made by the reader, not by builders
# per detector: a sample on which it reports something (so its reading is exercised)
EXERCISED = {"herd": "dns-ttl-herd.pcap", "retry_storm": "dns-retry-storm.pcapng",
             "smb_break_queue": "smb2-break-queue.pcap", "tcp_stall": "tcp-rto-blackout.pcap",
             "toctou": "ldap-toctou.pcapng", "conn_churn": "ldap-conn-churn.pcap",
             "saturation": "ldap-saturation.pcap", "replication_conflict": "ldap-repl-conflict.pcap",
             "incast": "tcp-incast.pcap", "replay": "krb5-replay-ldap-gssapi.pcapng",
             "lock_polling": "nfs4-lock-polling.pcap", "delegation_recall": "nfs4-delegation-recall.pcap",
             # generated RoCEv2 captures (tests/rocev2_captures.py, scale ROCEV2_SCALE): "rocev2:<scenario>"
             "gbn_retransmission": "rocev2:rocev2-gbn-storm", "pfc_storm": "rocev2:rocev2-pfc-storm",
             "rnr_retry": "rocev2:rocev2-rnr-loop", "ecn_congestion": "rocev2:rocev2-incast"}
# ... and one of another protocol, where it may read less than it declares (never more)
OTHER = {"herd": "smb2-toctou.pcap", "saturation": "smb2-break-queue.pcap", "retry_storm": "ldap-toctou.pcapng", "smb_break_queue": "dns-ttl-herd.pcap",
         "tcp_stall": "ldap-toctou.pcapng", "toctou": "tcp-rto-blackout.pcap", "conn_churn": "smb2-break-queue.pcap",
         "gbn_retransmission": "dns-ttl-herd.pcap", "pfc_storm": "tcp-rto-blackout.pcap",
         "rnr_retry": "smb2-toctou.pcap", "ecn_congestion": "ldap-conn-churn.pcap",
         "replication_conflict": "ldap-toctou.pcapng", "incast": "dns-ttl-herd.pcap",
         "replay": "dns-ttl-herd.pcap", "lock_polling": "dns-ttl-herd.pcap",
         "delegation_recall": "smb2-break-queue.pcap"}
ROCEV2_SCALE = 0.1


def _sample(sample: str) -> Path:
    """A sample's path: samples/<file>, or a generated RoCEv2 capture for ``rocev2:<scenario>``."""
    if sample.startswith("rocev2:"):
        import rocev2_captures

        return rocev2_captures.rocev2_capture(sample.removeprefix("rocev2:"), ROCEV2_SCALE)
    return SAMPLES / sample

# A whole detector, as a newcomer would write it in detectors/<name>.py (here written to a temporary
# directory and registered, so nothing of the tree changes): its declarations, typed Params, findings().
THROWAWAY = '''
"""Packet bursts: more packets in one second than ``min_packets`` (a throwaway test detector)."""
from dataclasses import dataclass

import polars as pl

from detectors.base import evidence, findings, empty_findings, resolution_ns
from detectors.params import LOWER, param

NAME = "burst_probe"
KINDS = ("burst",)
REQUIRES = ("packets", "interfaces")
ORDER = 99


@dataclass(frozen=True)
class Params:
    min_packets: int = param(50, "packets in one second before reporting", unit="packets", gate=LOWER, lo=1)


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    tick = resolution_ns(capture)
    per = (capture.packets.group_by((pl.col("ts_ns") // 1_000_000_000).alias("sec"))
           .agg(pl.len().alias("n"), pl.col("ts_ns").min().alias("start_ns"), pl.col("ts_ns").max().alias("end_ns"),
                evidence(pl.col("frame")))
           .filter(pl.col("n") >= params.min_packets).sort("n", "sec", descending=[True, False]).head(1))
    if per.height == 0:
        return empty_findings()
    rows = per.select(pl.lit("burst").alias("kind"), pl.lit("low").alias("severity"), "start_ns", "end_ns",
                      pl.lit("packets_per_second").alias("metric"), pl.col("n").cast(pl.Float64).alias("value"),
                      pl.lit(float(params.min_packets)).alias("threshold"), pl.lit("packets").alias("unit"),
                      "evidence_frames",
                      pl.format("{} packets in one second (tick {} ns)", "n", pl.lit(tick)).alias("explanation"))
    return findings(rows, detector=NAME, params=params)
'''


def _load(tmp_path: Path, name: str, source: str) -> types.ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def throwaway(tmp_path):
    module = detectors.register(_load(tmp_path, "burst_probe_detector", THROWAWAY))
    yield module
    detectors.unregister(module.NAME)
    assert "burst_probe" not in detectors.available()


@pytest.fixture
def built(monkeypatch):
    """The captures any frame builder ran on while the test runs (a builder may set further frames, as
    the connections builder sets tcp_segments: the capture's own frames say what was built)."""
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        cap.frame_names()  # imports every builder module, so all of them are wrapped below
    caps: list = []

    def recording(fn):
        def build(cap):
            if not any(c is cap for c in caps):
                caps.append(cap)
            return fn(cap)
        return build

    for name, fn in list(FRAME_BUILDERS.items()):
        monkeypatch.setitem(FRAME_BUILDERS, name, recording(fn))
    return caps


def _derived(caps) -> set[str]:
    """The frames built (beyond the reader's) in these captures."""
    return {name for cap in caps for name in cap.built_names()} - READER_FRAMES


# -- discovery ------------------------------------------------------------------------------------------

def test_discovery_finds_every_detector_in_its_order():
    assert list(detectors.discover()) == DETECTORS
    assert list(detectors.available()) == DETECTORS
    assert [d["name"] for d in detectors.describe()] == [*DETECTORS, "population", "incident"]


def test_helpers_are_not_detectors_and_half_a_detector_is_an_error():
    for helper in ("base", "params", "population", "incidents", "herd_search", "tcp_stall_kinds", "listing"):
        assert not detectors.is_detector(importlib.import_module(f"detectors.{helper}")), helper
    half = types.ModuleType("half")
    half.NAME, half.detect = "half", lambda capture, params: None
    with pytest.raises(TypeError, match="Params, REQUIRES, KINDS"):
        detectors.is_detector(half)
    kinds_only = types.ModuleType("kinds_only")  # detect forgotten: refused, not skipped
    kinds_only.NAME, kinds_only.KINDS, kinds_only.REQUIRES = "kinds_only", ("k",), ("packets",)
    with pytest.raises(TypeError, match="defines KINDS but not detect, Params"):
        detectors.is_detector(kinds_only)


def test_a_detector_that_fails_to_import_is_an_error_not_a_skip(monkeypatch):
    real = importlib.import_module

    def failing(name, *args):
        if name == "detectors.toctou":
            raise ModuleNotFoundError("No module named 'detectors.toctou'", name="detectors.toctou")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", failing)
    try:
        with pytest.raises(ModuleNotFoundError):
            detectors.discover()
    finally:
        monkeypatch.undo()
        detectors.discover()
    assert list(detectors.available()) == DETECTORS


@pytest.mark.parametrize("name", DETECTORS)
def test_every_detector_declares_the_contract(name):
    module = detectors.available()[name]
    detectors.check_contract(module)
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        known = set(cap.frame_names())
    assert set(module.REQUIRES) <= known, f"{name}.REQUIRES names frames nobody builds"
    assert len(set(module.REQUIRES)) == len(module.REQUIRES)
    assert isinstance(module.ORDER, int)
    assert (module.__doc__ or "").strip(), f"{name} has no docstring (its summary in the listing)"


def test_contract_violations_are_refused(throwaway):
    bad = types.ModuleType("bad")
    for attr in ("NAME", "detect", "Params", "REQUIRES", "KINDS"):
        setattr(bad, attr, getattr(throwaway, attr))
    bad.REQUIRES = []  # a list, and empty
    with pytest.raises(TypeError, match="REQUIRES"):
        detectors.register(bad)
    bad.REQUIRES, bad.NAME = ("packets",), "population"  # the population step's name is taken
    with pytest.raises(TypeError, match="NAME"):
        detectors.register(bad)
    bad.NAME, bad.POPULATION = "bad", {"kinds": ("burst",), "service": "resource", "member": "client"}
    with pytest.raises(TypeError, match="connections"):  # the population step's frames not required
        detectors.register(bad)
    del bad.POPULATION
    bad.PARTITION = "entry"  # partitions are by server or by client
    with pytest.raises(TypeError, match="PARTITION"):
        detectors.register(bad)
    bad.PARTITION = "client"  # a client bucket holds connection frames, not packets
    with pytest.raises(TypeError, match="client bucket holds .* not packets"):
        detectors.register(bad)
    bad.PARTITION, bad.partial = "server", lambda capture, params: {}  # two steps: partial without finish
    with pytest.raises(TypeError, match="partial or finish"):
        detectors.register(bad)
    bad.PARTITION, bad.finish = None, lambda parts, capture, params: parts  # both, but not by server
    with pytest.raises(TypeError, match="partial or finish"):
        detectors.register(bad)
    del bad.partial, bad.finish
    bad.SILENCE = "gap_ns"  # not one of its parameters
    with pytest.raises(TypeError, match="SILENCE must name one of its Params"):
        detectors.register(bad)
    del bad.SILENCE
    bad.ROWS = {"dns_messages": pl.col("qr")}  # a frame it does not require
    with pytest.raises(TypeError, match="ROWS must map frames among its REQUIRES"):
        detectors.register(bad)
    bad.ROWS = {"packets": "qr"}  # not an expression
    with pytest.raises(TypeError, match="ROWS must map frames among its REQUIRES"):
        detectors.register(bad)
    assert "bad" not in detectors.available()


def test_a_detector_in_two_steps_is_its_finish_of_its_partial():
    """retry_storm runs in two steps (base.py, PARTITION): its parts, as a partition hands them back,
    finished where they meet, are its findings."""
    module = detectors.available()["retry_storm"]
    with open_capture(SAMPLES / "dns-retry-storm.pcapng") as cap:
        whole = detectors.run(cap, only=["retry_storm"])
        parts = detectors.detect_frames(cap, ["retry_storm"])
        assert sorted(parts) == [f"retry_storm:{p}" for p in ("answered", "episodes", "latencies", "servers")]
        again = detectors.run(cap, only=["retry_storm"], found_elsewhere=parts)
    assert whole.height and again.to_dicts() == whole.to_dicts()
    assert module.finish({k.partition(":")[2]: f.head(0) for k, f in parts.items()}, None).height == 0


def test_population_reads_only_what_it_declares_and_its_detectors_require_it():
    assert detectors.population.REQUIRES == ("connections",)
    for name, module in detectors.available().items():
        if getattr(module, "POPULATION", None):
            assert set(detectors.population.REQUIRES) <= set(module.REQUIRES), name


# -- a throwaway detector goes everywhere the six go ------------------------------------------------------

def test_a_throwaway_detector_runs_everywhere(throwaway, built, capsys):
    assert list(detectors.available()) == [*DETECTORS, "burst_probe"]
    params = detectors.configure(["burst_probe"], {"burst_probe.min_packets": 10})
    assert params["burst_probe"].min_packets == 10
    with pytest.raises(detectors.ParameterError, match="min_packets"):
        detectors.configure(["burst_probe"], {"burst_probe.min_packets": 0})
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        found = detectors.run(cap, only=["burst_probe"], overrides={"burst_probe.min_packets": 10})
        assert found.height == 1 and found["detector"][0] == "burst_probe" and found["value"][0] >= 10
        assert set(cap.built_frames()) == READER_FRAMES  # it needs nothing built
        assert detectors.run(cap, only=["burst_probe"], overrides={"burst_probe.min_packets": 10**6}).height == 0
    row = next(d for d in detectors.describe() if d["name"] == "burst_probe")
    assert row["kinds"] == ["burst"] and row["requires"] == ["packets", "interfaces"]
    assert [p["name"] for p in row["parameters"]] == ["min_packets"] and row["summary"].startswith("Packet bursts")

    assert main(["detectors", "--format", "json"]) == 0
    names = [d["name"] for d in json.loads(capsys.readouterr().out)["detectors"]]
    assert names == [*DETECTORS, "burst_probe", "population", "incident"]
    assert main(["detectors", "burst_probe"]) == 0
    assert "min_packets" in capsys.readouterr().out

    built.clear()
    main(["scan", "--format", "json", "--detectors", "burst_probe", "--set", "burst_probe.min_packets=10",
          str(SAMPLES / "dns-ttl-herd.pcap")])
    doc = json.loads(capsys.readouterr().out)
    assert built == []  # it needs no built frame, and neither does the scan's summary around it
    assert doc["captures"][0]["detectors"] == ["burst_probe"]
    assert [f["detector"] for f in doc["findings"]] == ["burst_probe"]
    main(["scan", "--format", "json", str(SAMPLES / "dns-ttl-herd.pcap")])  # all detectors, the new one too
    doc = json.loads(capsys.readouterr().out)
    assert doc["captures"][0]["detectors"] == [*DETECTORS, "burst_probe"]


# -- KINDS enforced --------------------------------------------------------------------------------------

def test_a_finding_of_an_undeclared_kind_is_an_error(throwaway, monkeypatch):
    monkeypatch.setattr(throwaway, "KINDS", ("spike",))
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        overrides = {"burst_probe.min_packets": 10}
        with pytest.raises(TypeError, match=r"'burst_probe' returned findings of kind 'burst'.*burst_probe\.KINDS"):
            detectors.run(cap, only=["burst_probe"], overrides=overrides)
        errors: dict[str, str] = {}  # the dashboard's way: recorded, the others still run
        found = detectors.run(cap, only=["burst_probe", "herd"], overrides=overrides, errors=errors)
        assert errors["burst_probe"].startswith("TypeError: detector 'burst_probe' returned findings of kind 'burst'")
        assert found.height and set(found["detector"]) == {"herd"}
        monkeypatch.setattr(throwaway, "KINDS", ("spike", "burst"))
        assert detectors.run(cap, only=["burst_probe"], overrides=overrides).height == 1


# -- REQUIRES enforced -----------------------------------------------------------------------------------

def test_reading_an_undeclared_frame_fails_clearly(throwaway, monkeypatch):
    honest = throwaway.detect

    def sneaky(capture, params):
        capture.frame("connections")
        return throwaway.findings(pl.DataFrame(), detector="burst_probe", params=params)

    monkeypatch.setattr(throwaway, "detect", sneaky)
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        with pytest.raises(UndeclaredFrame, match=r"'burst_probe' read the frame 'connections'.*burst_probe\.REQUIRES"):
            detectors.run(cap, only=["burst_probe"])
        assert "connections" not in cap.built_frames()  # refused before anything was built
        errors: dict[str, str] = {}  # the dashboard's way: recorded, the others still run
        detectors.run(cap, only=["burst_probe", "herd"], errors=errors)
        assert errors["burst_probe"].startswith("UndeclaredFrame: detector 'burst_probe' read the frame 'connections'")

    monkeypatch.setattr(throwaway, "detect", honest)
    monkeypatch.setattr(throwaway, "REQUIRES", ("interfaces",))  # packets is a frame too
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        with pytest.raises(UndeclaredFrame, match="'packets'"):
            detectors.run(cap, only=["burst_probe"])


def test_the_view_passes_through_what_is_not_a_frame_and_nothing_else():
    assert CaptureView.PASS_THROUGH == {"path", "files", "pieces", "warnings", "frames_by_file"}
    with open_capture(SAMPLES / "dns-ttl-herd.pcap") as cap:
        view = CaptureView(cap, "x", ("packets",))
        assert view.path == cap.path and view.files == cap.files and view.pieces == cap.pieces
        assert view.warnings is cap.warnings
        assert view.frames_by_file([1, 2]) == cap.frames_by_file([1, 2])
        assert view.packets.height == cap.packets.height
        with pytest.raises(UndeclaredFrame, match="'interfaces'"):
            view.frame("interfaces")
        # the raw bytes and the builders' shared cache (a detector could overwrite it) are not its business
        for forbidden in ("set_frame", "built_frames", "restrict_packets", "_frames", "memo", "buf", "bytes_at",
                          "selection", "report"):
            with pytest.raises(AttributeError):
                getattr(view, forbidden)


def test_every_detector_runs_on_a_view_of_an_empty_capture():
    # a capture with none of their frames (tests/fakes.py: KeyError for each) is nothing to report,
    # not an error, also through the view detectors.run hands them
    from fakes import FakeCapture

    for name in DETECTORS:
        assert detectors.run(FakeCapture(), only=[name]).height == 0, name


# -- scan --detectors X builds only X's frames -------------------------------------------------------------

def _declared_build(sample: str, names: list[str]) -> set[str]:
    """The frames a fresh capture builds when asked for what these detectors declare."""
    with open_capture(_sample(sample)) as cap:
        for frame in detectors.required_frames(names):
            cap.frame(frame)
        return _derived([cap])


@pytest.mark.parametrize("name", DETECTORS)
def test_scan_of_one_detector_builds_only_its_frames(name, built, capsys):
    for sample, exact in ((EXERCISED[name], True), (OTHER[name], False)):
        want = _declared_build(sample, [name])
        with open_capture(_sample(sample)) as cap:
            found = detectors.run(cap, only=[name])
            by_run = _derived([cap])
        built.clear()
        main(["scan", "--format", "json", "--detectors", name, str(_sample(sample))])
        doc = json.loads(capsys.readouterr().out)
        by_scan = _derived(built)
        assert len(built) <= 1  # the one capture scan opened (none when nothing was built)
        if exact:  # exercised: it reads what it declares, and the scan around it builds nothing more
            assert found.filter(pl.col("detector") == name).height, f"{sample} does not exercise {name}"
            assert by_run == want, (sample, sorted(want ^ by_run))
            assert by_scan == want, (sample, sorted(want ^ by_scan))
        else:  # lazily: never a frame it did not declare
            assert by_run <= want and by_scan <= want, (sample, sorted((by_run | by_scan) - want))
        assert doc["captures"][0]["detectors"] == [name]


def test_required_frames_of_a_selection_is_the_union():
    assert set(detectors.required_frames(["herd", "toctou"])) == (
        set(detectors.available()["herd"].REQUIRES) | set(detectors.available()["toctou"].REQUIRES))
    assert set(detectors.required_frames()) == {f for m in detectors.available().values() for f in m.REQUIRES}


# -- one client-identity rule --------------------------------------------------------------------------------

def test_client_identity_is_client_identity_by_without_groups():
    S = 1_000_000_000
    req = pl.DataFrame({
        # 10.0.0.1: two requests outstanding at once from two ports -> address:port
        # 10.0.0.2: a new port per request, one at a time -> address
        "client": ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.2"],
        "client_port": [1000, 1001, 2000, 2001, 2002],
        "request_ts_ns": [0, S // 10, 0, 2 * S, 4 * S],
        "response_ts_ns": [S, S, S // 10, 2 * S + S // 10, None],
    })
    expr, rule = client_identity(req)
    by = client_identity_by(req, [])
    assert rule == "address+port"
    assert req.select(expr.alias("c"))["c"].to_list() == by["client_id"].to_list() == [
        "10.0.0.1:1000", "10.0.0.1:1001", "10.0.0.2", "10.0.0.2", "10.0.0.2"]
    assert by["client_identity"].to_list() == ["address+port"] * 2 + ["address"] * 3
    sequential = req.filter(pl.col("client") == "10.0.0.2")
    assert client_identity(sequential)[1] == "address"
    assert client_identity(req.clear())[1] == "address"


@pytest.mark.parametrize("name", sorted(detectors.available()))
def test_declared_columns_are_columns_of_frames_it_requires(name):
    """COLUMNS (base.py) names frames of REQUIRES and columns those frames have (a typo would make a
    scan keep too little and the detector fail)."""
    from analyzer.schema import FRAMES

    module = detectors.available()[name]
    for frame, columns in getattr(module, "COLUMNS", {}).items():
        assert frame in module.REQUIRES, frame
        assert set(columns) <= {c.name for c in FRAMES[frame]}, (frame, set(columns) - {c.name for c in FRAMES[frame]})


def test_a_view_serves_only_the_declared_columns():
    with open_capture(SAMPLES / "smb2-break-queue.pcap") as cap:
        seen = CaptureView(cap, "x", ("tcp_segments", "connections"), {"tcp_segments": ("conn", "frame")})
        assert seen.frame("tcp_segments").columns == ["conn", "frame"]
        assert seen.frame("connections").columns == cap.frame("connections").columns
        with pytest.raises(pl.exceptions.ColumnNotFoundError):
            seen.frame("tcp_segments").select("seglen")


def test_a_view_serves_only_the_declared_rows():
    """ROWS (base.py): the view serves a frame filtered to them (retry_storm: of dns_messages the
    re-sent queries, what DNS's resends hook reads), and its hook finds the same resends in them."""
    from analyzer.decoders.registry import protocol
    from detectors.retry_storm_sends import resends_of

    retry_storm = detectors.available()["retry_storm"]
    with open_capture(SAMPLES / "dns-retry-storm.pcapng") as cap:
        messages, transactions = cap.frame("dns_messages"), cap.frame("dns_transactions")
        seen = detectors.view(cap, retry_storm).frame("dns_messages")
    assert 0 < seen.height < messages.filter(~pl.col("qr")).height
    assert seen.height == messages.filter(pl.col("retransmission") & ~pl.col("qr")).height
    dns = protocol("dns")
    assert resends_of(dns, seen, transactions).equals(resends_of(dns, messages, transactions))
    assert resends_of(dns, seen, transactions).height == seen.height


def test_a_scan_keeps_the_columns_all_readers_declare_and_whole_frames_otherwise():
    from detectors import declared_columns, narrow_to_declared, population, tcp_stall, tcp_turns

    stall, saturation = detectors.available()["tcp_stall"], detectors.available()["saturation"]
    assert declared_columns([stall, saturation], "tcp_segments") == set(tcp_stall.SEGMENT_COLUMNS) | set(
        tcp_turns.SEGMENT_COLUMNS)
    assert declared_columns([stall, population], "connections") is None  # tcp_stall reads it whole
    assert declared_columns([population], "tcp_segments") is None  # no reader
    with open_capture(SAMPLES / "smb2-break-queue.pcap") as cap:
        whole = cap.frame("tcp_segments").columns
        connections = cap.frame("connections").columns
        narrow_to_declared(cap, [stall, saturation], ["tcp_segments", "connections"])
        assert cap.frame("tcp_segments").columns == [c for c in whole if c in declared_columns(
            [stall, saturation], "tcp_segments")]
        assert cap.frame("connections").columns == connections
