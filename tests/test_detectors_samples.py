"""Golden findings: every real-server sample fires the detectors its manifest names, about when and
where it says, and stays silent (nothing >= medium) for the others; healthy twins and the ordinary
corpus captures stay silent altogether. False positives are bugs.

A detector the manifest names that does not exist is a failure, as is a registry with no detectors.
"""
import sys
from pathlib import Path

import polars as pl
import pytest

from detectors import at_least, available
from shared_captures import shared_capture, shared_run
from tshark_ref import corpus_files

sys.path.insert(0, str(Path(__file__).parent.parent / "samples"))
from groundtruth import count_ok, false_alarms, load_manifest, matches  # noqa: E402  (shared with evaluate.py, test_detectors_eval.py)

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"
MANIFEST = load_manifest(SAMPLES / "MANIFEST.toml")
CORPUS = Path(__file__).parent / "data" / "corpus"

_cache: dict[str, tuple[pl.DataFrame, int]] = {}


def findings_of(path: Path) -> tuple[pl.DataFrame, int]:
    """(every detector's findings, first packet ns), on the session's shared capture of ``path``."""
    key = str(path)
    if key not in _cache:
        _cache[key] = (shared_run(path), int(shared_capture(path).packets["ts_ns"].min()))
    return _cache[key]


EXPECTS = [(c["file"], k, e) for c in MANIFEST for k, e in enumerate(c.get("expect", []))]


@pytest.mark.parametrize("file,k,expect", EXPECTS, ids=[f"{f}#{k}-{e['detector']}" for f, k, e in EXPECTS])
def test_pathological_sample_fires(file, k, expect):
    assert expect["detector"] in available(), f"the manifest expects detector {expect['detector']}: not registered"
    f, first = findings_of(SAMPLES / file)
    hits = matches(f, expect, first)
    assert count_ok(hits, expect), (
        f"{hits.height} {expect['detector']} findings >= {expect['min_severity']} on {expect.get('resource')!r} "
        f"near {expect['start_s']} s; "
        f"all findings: {f.select('detector', 'kind', 'severity', 'start_ns', 'server', 'resource').to_dicts()}")


SILENT = [(c["file"], d) for c in MANIFEST for d in c.get("silent", [])]


@pytest.mark.parametrize("file,detector", SILENT, ids=[f"{f}-{d}" for f, d in SILENT])
def test_sample_stays_silent_for_other_detectors(file, detector):
    assert detector in available(), f"the manifest names detector {detector}: not registered"
    f, _ = findings_of(SAMPLES / file)
    loud = at_least(f.filter(pl.col("detector") == detector), "medium")
    assert loud.height == 0, loud.select("kind", "severity", "explanation").to_dicts()


ROCEV2_FRAMES = {"rocev2_packets", "rocev2_flows", "pause_frames"}
PATHOLOGICAL = [c["file"] for c in MANIFEST if not c["healthy"]]


@pytest.mark.parametrize("file", PATHOLOGICAL)
def test_rocev2_detectors_stay_silent_on_the_real_samples(file):
    # the manifest's silent lists predate the RoCEv2 detectors (and make_real.py writes them): none of
    # these captures carries RoCEv2 or MAC control, so nothing of them may reach medium
    roce = [n for n, m in available().items() if ROCEV2_FRAMES & set(m.REQUIRES)]
    assert len(roce) >= 4
    f, _ = findings_of(SAMPLES / file)
    loud = at_least(f.filter(pl.col("detector").is_in(roce)), "medium")
    assert loud.height == 0, loud.select("detector", "kind", "severity", "explanation").to_dicts()


HEALTHY = [c["file"] for c in MANIFEST if c["healthy"]]


@pytest.mark.parametrize("file", HEALTHY)
def test_healthy_twin_has_nothing_medium_or_worse(file):
    assert available(), "no detectors registered"
    f, _ = findings_of(SAMPLES / file)
    loud = at_least(f, "medium")
    assert loud.height == 0, loud.select("detector", "kind", "severity", "explanation").to_dicts()


NORMAL = sorted(r["file"] for r in corpus_files("normal"))


@pytest.mark.parametrize("rel", NORMAL)
def test_ordinary_corpus_capture_has_nothing_medium_or_worse(rel):
    assert available(), "no detectors registered"
    f, _ = findings_of(CORPUS / rel)
    loud = at_least(f, "medium")
    assert loud.height == 0, loud.select("detector", "kind", "severity", "explanation").to_dicts()


# -- generated RoCEv2 captures (issue 16): samples/rocev2_synth.py, not recorded; cached by
# tests/rocev2_captures.py. Each label is found (samples/groundtruth.py, the evaluation's matching) and
# every detector the labels do not name stays below medium; a healthy twin has nothing >= medium.
import rocev2_captures as rc  # noqa: E402

ROCEV2_SCALE, ROCEV2_SEED = 0.1, 1


@pytest.mark.parametrize("scenario", rc.scenarios())
def test_generated_rocev2_capture_meets_its_labels(scenario):
    path = rc.rocev2_capture(scenario, ROCEV2_SCALE, ROCEV2_SEED)
    f, first = findings_of(path)
    rec = rc.record(scenario, ROCEV2_SCALE, ROCEV2_SEED, list(available()), first)
    for e in rec["expect"]:
        assert e["detector"] in available(), f"the labels name detector {e['detector']}: not registered"
        hits = matches(f, e, first)
        assert count_ok(hits, e), (
            f"{hits.height} {e['detector']}/{e.get('kind') or '*'} findings >= {e['min_severity']} on "
            f"{e['server']} {e['resource']!r} in {e['start_s'] * 1e3:.3f}..{e['measured']['end_s'] * 1e3:.3f} ms; all: "
            f"{f.select('detector', 'kind', 'severity', 'start_ns', 'server', 'resource').to_dicts()}")
    loud = at_least(f, "medium") if rec["healthy"] else false_alarms(f, rec)
    assert loud.height == 0, loud.select("detector", "kind", "severity", "explanation").to_dicts()


def test_labels_become_expectations_named_as_the_wire_names_them():
    import groundtruth as gt
    from detectors.base import FINDINGS_SCHEMA

    path = rc.rocev2_capture("rocev2-pfc-storm", 0.02)
    lab = rc.labels(path)[0]
    t0 = lab["start_ns"] - 10**6
    (e,) = rc.record("rocev2-pfc-storm", 0.02, 1, ["pfc_storm", "ecn_congestion"], t0)["expect"]
    # the label's interval after the first packet; the server as a pause frame names it (the origin's MAC)
    assert e["start_s"] == pytest.approx(1e-3) and e["measured"]["end_s"] == pytest.approx(
        (lab["end_ns"] - t0) / 1e9)
    assert e["server"] == ":".join(lab["parameters"]["origin_mac"][i:i + 2] for i in range(0, 12, 2))
    assert e["resource"] == "priority 3" and "kind" not in e
    cols = ("detector", "kind", "severity", "start_ns", "server", "resource", "member_of")
    f = pl.DataFrame([{"detector": "pfc_storm", "kind": "pause_spreading", "severity": "high",
                       "start_ns": lab["start_ns"] + 1000, "server": e["server"], "resource": "priority 3",
                       "member_of": None},
                      {"detector": "ecn_congestion", "kind": "incast", "severity": "high",
                       "start_ns": lab["start_ns"], "server": "10.1.0.1", "resource": "10.1.0.1", "member_of": None}],
                     schema={c: FINDINGS_SCHEMA[c] for c in cols})
    assert matches(f, e, t0).height == 1
    assert matches(f, {**e, "start_s": e["measured"]["end_s"] + 2 * rc.SLACK_S, "measured": {}}, t0).height == 0
    # a silent entry for one kind of a detector: only that kind is a false alarm
    assert false_alarms(f, {"silent": ["ecn_congestion/cnp_no_slowdown"]}).height == 0
    assert false_alarms(f, {"silent": ["ecn_congestion/incast"]})["kind"].to_list() == ["incast"]
    assert gt.loud(f, "high", "ecn_congestion/incast").height == 1
    twin = rc.record("rocev2-cnp-ignored-healthy", 0.02, 1, ["pfc_storm", "ecn_congestion"], t0)
    assert not twin["healthy"] and twin["silent"] == ["pfc_storm", "ecn_congestion/cnp_no_slowdown"]
