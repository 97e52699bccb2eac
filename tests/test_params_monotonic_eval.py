"""The monotonic-gate promise (tests/test_params_monotonic.py) on the evaluation recordings of
samples/eval/ (real servers, never tuned to): for the gates that decide herds and connection churn,
along a ladder of values around the default, lowering a lower bound (raising an upper bound) never
removes or downgrades a top-level finding of a (kind, server). A gate the default run does not read on
a recording (tests/param_reads.py) cannot change its findings there: it is checked at the loosest end
of its ladder only."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import detectors
from detectors.base import SEVERITY_RANK
from detectors.params import LOWER, fields_of, spec_of
from param_reads import recording_runs
from shared_captures import shared_capture

EVAL = Path(__file__).parent.parent / "samples" / "eval"
CAPTURES = [EVAL / c["file"] for c in tomllib.loads((EVAL / "MANIFEST.toml").read_text())["capture"]]
GATES = {"herd": ("min_clients", "medium_clients", "rate_factor", "max_span_ns"),
         "conn_churn": ("min_connections", "min_rate_per_s", "medium_rate_per_s", "high_rate_per_s")}
LADDER = (0.1, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 4)  # multiples of the default


def ladder(field) -> list:
    spec, default = spec_of(field), field.default
    whole = isinstance(default, int)
    vals = {max(spec.lo or 0, round(default * k) if whole else default * k) for k in LADDER}
    return sorted(v for v in vals if spec.hi is None or v <= spec.hi)


def worst_by_key(cap, detector: str, overrides: dict) -> dict:
    found = detectors.top_level(detectors.run(cap, only=[detector], overrides=overrides))
    out: dict = {}
    for r in found.iter_rows(named=True):
        key = (r["kind"], r["server"])
        out[key] = max(out.get(key, -1), SEVERITY_RANK[str(r["severity"])])
    return out


@pytest.mark.parametrize("path", CAPTURES, ids=[p.name for p in CAPTURES])
def test_gates_are_monotonic_on_the_eval_recordings(path):
    bad = []
    cap = shared_capture(path)  # read and analysed once per session (tests/test_detectors_eval.py too)
    for detector, names in GATES.items():
        fields = {f.name: f for f in fields_of(detectors.available()[detector].Params)}
        with recording_runs() as read:  # which parameters the default run reads (tests/param_reads.py)
            at_default = worst_by_key(cap, detector, {})
        for name in names:
            f = fields[name]
            if name not in read[detector]:
                # never read on this capture: every value finds what the default finds (tests/param_reads.py);
                # the loosest end of the ladder, where a new finding would appear first, confirms it
                loosest = ladder(f)[0] if spec_of(f).gate == LOWER else ladder(f)[-1]
                got = worst_by_key(cap, detector, {f"{detector}.{name}": loosest})
                if got != at_default:
                    bad.append(f"{detector}.{name} = {loosest}, unread at the default, changed {at_default} to {got}")
                continue
            runs = {f.default: at_default}

            def at(v):  # a value's findings, computed when first needed
                if v not in runs:
                    runs[v] = worst_by_key(cap, detector, {f"{detector}.{name}": v})
                return runs[v]

            values = ladder(f)
            for a, b in zip(values, values[1:]):
                lax_at, strict_at = (a, b) if spec_of(f).gate == LOWER else (b, a)
                strict = at(strict_at)
                if not strict:
                    continue  # the stricter setting finds nothing: nothing the looser one could miss
                lax = at(lax_at)
                bad += [f"{detector}.{name} {a} -> {b}: {key} {lax.get(key)} < {sev}"
                        for key, sev in strict.items() if lax.get(key, -1) < sev]
    assert not bad, "\n".join(bad)
