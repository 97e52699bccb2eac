"""Every gating parameter keeps its promise (detectors/params.py): for a ``gate=LOWER`` parameter and
values a < b (within the declared range), every finding at b has a finding at a with the same
(detector, kind, server) and a severity at least as high — lowering a lower bound never removes or
downgrades a finding, raising it never adds one; ``gate=UPPER`` the other way round.

Checked for EVERY parameter declared with a gate in EVERY detector (``detectors.available()``,
``detectors.params.fields_of``/``spec_of``), with Hypothesis drawing the pairs (derandomized, a few
examples each), over every capture of samples/MANIFEST.toml (pathological and healthy) and generated
scenarios: a small samples/synth.py capture (every labelled pathology) and the one-node herds of
tests/scenarios_one_node.py. Captures are opened once per session; a detector's findings for one
value are computed once and shared by every pair that uses it.
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

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"
EXAMPLES = 4  # pairs per parameter (derandomized: the same pairs on every run)

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

    from analyzer import open_capture

    sys.path.insert(0, str(SAMPLES))
    import synth

    paths = [SAMPLES / c["file"] for c in tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())["capture"]]
    d = tmp_path_factory.mktemp("monotonic")
    synth.generate(str(d / "synth.pcap"), packets=20_000, seed=11)
    paths += [d / "synth.pcap",
              Path(sc.dns_one_node_herd(str(d / "dns-one-node.pcap"))),
              Path(sc.krb_one_node_herd(str(d / "krb-one-node-udp.pcap"))),
              Path(sc.krb_one_node_herd(str(d / "krb-one-node-tcp.pcap"), tcp=True))]
    caps = {p.name: open_capture(p) for p in paths}
    yield caps
    for c in caps.values():
        c.close()


_RESULTS: dict = {}


def findings_at(captures, name: str, field: str, value) -> dict[str, dict[tuple, int]]:
    """Per capture: (detector, kind, server) -> the highest severity rank among those findings, with
    ``field`` = ``value`` (every other parameter at its default); computed once per value."""
    module = detectors.available()[name]
    default = getattr(module.Params(), field) == value
    key = (name, None, None) if default else (name, field, value)  # the defaults: one run per detector
    if key not in _RESULTS:
        params = dataclasses.replace(module.Params(), **{field: value})
        per = {}
        for cap_name, cap in captures.items():
            best: dict[tuple, int] = {}
            for r in module.detect(cap, params).select("detector", "kind", "server", "severity").iter_rows():
                k, rank = r[:3], SEVERITY_RANK[r[3]]
                best[k] = max(best.get(k, -1), rank)
            per[cap_name] = best
        _RESULTS[key] = per
    return _RESULTS[key]


def violations(looser: dict, stricter: dict) -> list[str]:
    """What the stricter setting finds that the looser one misses or rates lower."""
    out = []
    for cap_name, found in stricter.items():
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
