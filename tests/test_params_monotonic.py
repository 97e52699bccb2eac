"""Every gating parameter keeps its promise (detectors/params.py): for a ``gate=LOWER`` parameter and
values a < b (within the declared range), every finding at b has a finding at a with the same
(detector, kind, server) and a severity at least as high — lowering a lower bound never removes or
downgrades a finding, raising it never adds one; ``gate=UPPER`` the other way round.

Checked for EVERY parameter declared with a gate in EVERY detector (``detectors.available()``,
``detectors.params.fields_of``/``spec_of``), with Hypothesis drawing the pairs (derandomized, a few
examples each), over every capture of samples/MANIFEST.toml (pathological and healthy) and generated
scenarios: a small samples/synth.py capture (every labelled pathology) and the one-node herds of
tests/scenarios_one_node.py; the RoCEv2 detectors (those reading a ROCEV2_FRAMES frame) over generated
RoCEv2 captures (tests/rocev2_captures.py) instead, and only they. Captures are opened once per
session; a detector's findings for one value are computed once and shared by every pair that uses it.
A value runs only on the captures where the detector's default run reads that parameter: elsewhere no
value of it can change a finding (tests/param_reads.py; test_an_unread_parameter_changes_nothing).
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import detectors
from detectors.base import SEVERITY_RANK
from detectors.params import LOWER, UPPER, fields_of, kind_of, spec_of
from param_reads import detect_reading

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"
EXAMPLES = 4  # pairs per parameter (derandomized: the same pairs on every run)
ROCEV2_FRAMES = {"rocev2_packets", "rocev2_flows", "pause_frames"}
ROCEV2_SCENARIOS = ("rocev2-healthy", "rocev2-pfc-storm", "rocev2-gbn-storm", "rocev2-ack-timeout", "rocev2-rnr-loop",
                    "rocev2-incast", "rocev2-cnp-ignored")
ROCEV2_SCALE = 0.02  # small: every gate of every RoCEv2 detector runs over each, several values each


def reads(module, cap_name: str) -> bool:
    """Generated RoCEv2 captures for the RoCEv2 detectors, the others for the rest (each finds nothing
    on the other kind; skipping it keeps the run short)."""
    return cap_name.startswith("rocev2-") == bool(ROCEV2_FRAMES & set(module.REQUIRES))


def _gated() -> list[tuple[str, dataclasses.Field]]:
    out = []
    for name, module in detectors.available().items():
        for f in fields_of(module.Params):
            if spec_of(f).gate in (LOWER, UPPER) and kind_of(f) in ("int", "float", "duration"):
                out.append((name, f))
    return out


GATED = _gated()


def test_every_gate_is_a_number():
    # the property below draws numbers; a gate on a set, word or flag would escape it
    for name, module in detectors.available().items():
        for f in fields_of(module.Params):
            if spec_of(f).gate is not None:
                assert kind_of(f) in ("int", "float", "duration"), (name, f.name)


def grid(f: dataclasses.Field) -> list:
    """Values to try: the range's ends and multiples of the default, within the declared range."""
    spec, d = spec_of(f), f.default
    lo = spec.lo if spec.lo is not None else 0
    top = spec.hi if spec.hi is not None else max(4 * d, lo + 4, 1)
    vals = {lo, top, d}
    for m in (0.1, 0.25, 0.5, 0.8, 1.25, 2, 4):
        vals.add(d * m)
    if d == 0:
        vals |= {1, 10, 1000}
    whole = kind_of(f) in ("int", "duration")
    out = set()
    for v in vals:
        v = min(max(v, lo), top)
        out.add(int(round(v)) if whole else float(v))
    return sorted(out)


def values(f: dataclasses.Field) -> st.SearchStrategy:
    """The grid, or any value in the range (up to 4x the default when it has no upper end)."""
    g = grid(f)
    if kind_of(f) in ("int", "duration"):
        anywhere = st.integers(int(math.ceil(g[0])), int(g[-1]))
    else:
        anywhere = st.floats(g[0], g[-1], allow_nan=False, allow_infinity=False)
    return st.one_of(st.sampled_from(g), anywhere)


# -- the captures -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def captures(tmp_path_factory):
    """Every sample of samples/MANIFEST.toml and the generated scenarios, each opened once."""
    import scenarios_one_node as sc
    import sys

    import rocev2_captures as rc

    from shared_captures import shared_capture

    sys.path.insert(0, str(SAMPLES))
    import synth

    paths = [SAMPLES / c["file"] for c in tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())["capture"]]
    d = tmp_path_factory.mktemp("monotonic")
    synth.generate(str(d / "synth.pcap"), packets=20_000, seed=11)
    paths += [d / "synth.pcap",
              Path(sc.dns_one_node_herd(str(d / "dns-one-node.pcap"))),
              Path(sc.krb_one_node_herd(str(d / "krb-one-node-udp.pcap"))),
              Path(sc.krb_one_node_herd(str(d / "krb-one-node-tcp.pcap"), tcp=True))]
    paths += [rc.rocev2_capture(name, ROCEV2_SCALE) for name in ROCEV2_SCENARIOS]
    return {p.name: shared_capture(p) for p in paths}  # each read and analysed once per session


_RESULTS: dict = {}
_READ: dict[tuple[str, str], frozenset] = {}  # (detector, capture) -> the fields its default run read


class Findings(dict):
    """Capture name -> {(detector, kind, server): highest severity rank} for one setting, over
    ``names`` (the captures its detector runs on); an entry is computed on first use, so a looser
    setting runs only where a stricter one found something (:func:`violations`)."""

    def __init__(self, names: list[str], compute=None):
        super().__init__()
        self.names, self._compute = names, compute

    def __missing__(self, cap_name: str) -> dict:
        self[cap_name] = worst = self._compute(cap_name)
        return worst


def _worst(found) -> dict[tuple, int]:
    best: dict[tuple, int] = {}
    for r in found.select("detector", "kind", "server", "severity").iter_rows():
        k, rank = r[:3], SEVERITY_RANK[r[3]]
        best[k] = max(best.get(k, -1), rank)
    return best


def findings_at(captures, name: str, field: str, value) -> Findings:
    """Per capture: (detector, kind, server) -> the highest severity rank among those findings, with
    ``field`` = ``value`` (every other parameter at its default); computed once per value and capture.

    A capture on which the default run never read ``field`` gets the default findings without a run:
    no value of a field the detector does not read can change what it finds (tests/param_reads.py;
    checked by test_an_unread_parameter_changes_nothing)."""
    module = detectors.available()[name]
    default = getattr(module.Params(), field) == value
    key = (name, None, None) if default else (name, field, value)  # the defaults: one run per detector
    if key not in _RESULTS:
        names = [c for c in captures if reads(module, c)]
        if default:
            per = Findings(names)
            for cap_name in names:
                found, _READ[(name, cap_name)] = detect_reading(module, captures[cap_name])
                per[cap_name] = _worst(found)
        else:
            at_default = findings_at(captures, name, field, getattr(module.Params(), field))
            params = dataclasses.replace(module.Params(), **{field: value})

            def compute(cap_name: str) -> dict:
                if field not in _READ[(name, cap_name)]:
                    return at_default[cap_name]
                return _worst(module.detect(captures[cap_name], params))

            per = Findings(names, compute)
        _RESULTS[key] = per
    return _RESULTS[key]


def violations(looser: Findings, stricter: Findings) -> list[str]:
    """What the stricter setting finds that the looser one misses or rates lower (the looser one is
    only looked at, so only computed, where the stricter one found something)."""
    out = []
    for cap_name in stricter.names:
        found = stricter[cap_name]
        if not found:
            continue
        have = looser[cap_name]
        for k, rank in sorted(found.items(), key=str):
            if have.get(k, -1) < rank:
                out.append(f"{cap_name}: {k} at severity rank {rank}, looser setting "
                           f"{'misses it' if k not in have else f'rates it {have[k]}'}")
    return out


@pytest.mark.parametrize("name, field", [pytest.param(n, f, id=f"{n}.{f.name}") for n, f in GATED])
def test_gate_is_monotonic(captures, name, field):
    gate = spec_of(field).gate

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(a=values(field), b=values(field))
    def check(a, b):
        if a == b:
            return
        a, b = min(a, b), max(a, b)
        at_a = findings_at(captures, name, field.name, a)
        at_b = findings_at(captures, name, field.name, b)
        # LOWER: the smaller value is the looser one; UPPER: the larger
        looser, stricter = (at_a, at_b) if gate == LOWER else (at_b, at_a)
        bad = violations(looser, stricter)
        assert not bad, (f"{name}.{field.name} ({gate} gate) {a} vs {b}:\n  " + "\n  ".join(bad[:10]))

    check()


# pairs the drawn examples once found broken, kept so they stay checked whatever Hypothesis draws:
# (detector, field, a, b) with a < b; on synth.pcap conn_churn found syn_backlog at 10.0.1.20 with
# syn_retry_ns = 17001 ns and not at 1054 ns (a median over a set that grows as the gate falls)
KNOWN_PAIRS = [("conn_churn", "syn_retry_ns", 1054, 17001)]


@pytest.mark.parametrize("name, field, a, b", [pytest.param(*k, id=f"{k[0]}.{k[1]}-{k[2]}-{k[3]}")
                                               for k in KNOWN_PAIRS])
def test_known_pair_is_monotonic(captures, name, field, a, b):
    gate = spec_of(next(f for n, f in GATED if n == name and f.name == field)).gate
    at_a, at_b = findings_at(captures, name, field, a), findings_at(captures, name, field, b)
    looser, stricter = (at_a, at_b) if gate == LOWER else (at_b, at_a)
    assert any(stricter[c] for c in stricter.names), "the stricter setting finds nothing: the pair checks nothing"
    bad = violations(looser, stricter)
    assert not bad, f"{name}.{field} ({gate} gate) {a} vs {b}:\n  " + "\n  ".join(bad[:10])


# -- what findings_at skips ------------------------------------------------------------------------

_DEFAULT_FINDINGS: dict = {}


@pytest.mark.parametrize("name", sorted({n for n, _ in GATED}))
def test_an_unread_parameter_changes_nothing(captures, name):
    """The claim findings_at relies on (tests/param_reads.py): on a capture where the default run never
    read a gate, the ends of the gate's range give exactly the default findings, every column. Checked
    for every gate of the detector that is unread somewhere, on the capture where it is unread and the
    detector finds the most at its defaults (where a change would show first)."""
    from polars.testing import assert_frame_equal

    module = detectors.available()[name]
    fields = [f for n, f in GATED if n == name]
    default_ranks = findings_at(captures, name, fields[0].name, fields[0].default)  # fills _READ
    for f in fields:
        unread = [c for c in captures if reads(module, c) and f.name not in _READ[(name, c)]]
        if not unread:
            continue
        cap_name = max(unread, key=lambda c: (len(default_ranks[c]), captures[c].packets.height, c))
        cap = captures[cap_name]
        if (name, cap_name) not in _DEFAULT_FINDINGS:
            _DEFAULT_FINDINGS[(name, cap_name)] = module.detect(cap, module.Params())
        base = _DEFAULT_FINDINGS[(name, cap_name)]
        g = grid(f)
        for v in (g[0], g[-1]):
            got = module.detect(cap, dataclasses.replace(module.Params(), **{f.name: v}))
            try:
                assert_frame_equal(got, base, check_exact=True)
            except AssertionError as exc:
                raise AssertionError(f"{name}.{f.name} = {v} (unread at the default) changed the findings on "
                                     f"{cap_name}: {exc}") from None


def test_the_record_of_reads_sees_every_way_of_reading_a_field():
    from param_reads import as_recording

    module = detectors.available()["tcp_stall"]
    every = {f.name for f in dataclasses.fields(module.Params)}
    p = as_recording(module.Params())
    seen = type(p).reads
    assert seen == set()  # constructing it is not reading it
    assert p.rto_min_gap_ns == module.Params().rto_min_gap_ns and seen == {"rto_min_gap_ns"}
    seen.clear()
    getattr(p, "delack_rtts")
    assert seen == {"delack_rtts"}
    seen.clear()
    q = dataclasses.replace(p, delack_rtts=1.0)  # a copy reads the others, and records into the same set
    assert seen >= every - {"delack_rtts"}
    seen.clear()
    q.window_rtts
    assert seen == {"window_rtts"}
    for whole in (vars, dataclasses.asdict, hash, repr):
        seen.clear()
        whole(p)
        assert seen == every, whole


def test_violations_look_at_the_looser_setting_only_where_the_stricter_found_something():
    asked = []
    looser = Findings(["a", "b", "c"], lambda c: asked.append(c) or {"a": {("d", "k", "s"): 1}}.get(c, {}))
    stricter = Findings(["a", "b", "c"], lambda c: {"a": {("d", "k", "s"): 2}, "c": {("d", "k", "t"): 0}}.get(c, {}))
    assert violations(looser, stricter) == [
        "a: ('d', 'k', 's') at severity rank 2, looser setting rates it 1",
        "c: ('d', 'k', 't') at severity rank 0, looser setting misses it"]
    assert asked == ["a", "c"]  # b: the stricter setting found nothing there, so nothing can be lost
    assert violations(stricter, looser) == []
