"""The real-server sample captures in samples/ and their ground truth (samples/MANIFEST.toml).

Default tests (fast, no root): every listed capture exists, is small, has the keys the
detector tests read, and - where tshark is installed - tshark reads it and sees the protocol
events the scenario is about, within the tolerances recorded next to them.

``-m real_samples`` (root, Debian packages, several minutes; never in CI) rebuilds every
capture with samples/make_real.py into a temporary directory and checks the fresh captures
against the committed manifest the same way.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import detectors

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
sys.path.insert(0, str(SAMPLES))

from realkit import facts  # noqa: E402  (standard library + the tshark binary)

MANIFEST = tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())
CAPTURES = MANIFEST["capture"]
BY_FILE = {c["file"]: c for c in CAPTURES}
DETECTORS = set(detectors.discover())  # a manifest names only detectors that exist
SEVERITIES = ["informational", "low", "medium", "high", "critical"]
CAPTURE_KEYS = {"file": str, "scenario": str, "healthy": bool, "twin": str, "made_with": str,
                "what_happened": str, "silent": list, "expect": list, "measured": dict,
                "tshark": dict, "tshark_tolerance": dict, "size_bytes": int}
EXPECT_KEYS = {"detector": str, "min_severity": str, "start_s": (int, float),
               "tolerance_s": (int, float), "client": str, "server": str, "resource": str,
               "count": int, "count_tolerance": int, "measured": dict}
# a sample is small; nfs41-saturation (16 NFSv4.1 sessions ramped past a server's knee, ~11k packets at
# a 256-byte snap length) is the one that needs more
MAX_BYTES = 1_000_000
MAX_BYTES_BY_FILE = {"nfs41-saturation.pcap": 2_200_000}
HAVE_TSHARK = shutil.which("tshark") is not None or Path(facts.TSHARK).exists()

PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": "pcap-us", b"\x4d\x3c\xb2\xa1": "pcap-ns",
              b"\x0a\x0d\x0d\x0a": "pcapng"}


def _kind(path: Path) -> str:
    with open(path, "rb") as f:
        return PCAP_MAGIC.get(f.read(4), "unknown")


@functools.lru_cache(maxsize=None)
def _frames(path: Path) -> tuple[int, float]:
    return facts.tshark_frames(path)


def _check_facts(cap: dict, path: Path, reference: dict) -> list[str]:
    """Recompute the tshark facts of `path` and compare with `reference` (a manifest entry)."""
    problems = []
    seen = facts.facts_for(cap["scenario"], path)
    for key, want in reference["tshark"].items():
        if key == "frames_total":
            continue
        if key not in seen:
            problems.append(f"{key}: not computed")
            continue
        tol = reference["tshark_tolerance"].get(key, 0)
        if abs(seen[key] - want) > tol:
            problems.append(f"{key}: tshark sees {seen[key]}, manifest says {want} +- {tol}")
    return problems


def test_manifest_lists_every_scenario_with_its_twin():
    sys.path.insert(0, str(SAMPLES))
    import make_real  # noqa: PLC0415  (imports only the standard library at module level)

    have = {(c["scenario"], c["healthy"]) for c in CAPTURES}
    for name, spec in make_real.SCENARIOS.items():
        assert (name, False) in have, f"{name}: no pathological capture in MANIFEST.toml"
        if spec[4]:
            assert (name, True) in have, f"{name}: no healthy twin in MANIFEST.toml"
    assert len({c["file"] for c in CAPTURES}) == len(CAPTURES), "duplicate file entries"


@pytest.mark.parametrize("cap", CAPTURES, ids=lambda c: c["file"])
def test_capture_exists_small_and_complete(cap):
    path = SAMPLES / cap["file"]
    assert path.is_file(), f"{cap['file']} listed in MANIFEST.toml but missing"
    size = path.stat().st_size
    assert size < MAX_BYTES_BY_FILE.get(cap["file"], MAX_BYTES), f"{cap['file']} is {size} bytes"
    assert size == cap["size_bytes"], "capture changed since the manifest was written"
    for key, typ in CAPTURE_KEYS.items():
        assert key in cap, f"missing key {key}"
        assert isinstance(cap[key], typ), f"{key} should be {typ}"
    # format: pcapng when named so; headers say ns for the TCP and SMB captures
    kind = _kind(path)
    assert kind != "unknown"
    assert (kind == "pcapng") == cap["file"].endswith(".pcapng")
    if cap["scenario"].startswith(("tcp-", "smb2-")):
        assert kind == "pcap-ns", f"{cap['file']} should have ns timestamps"
    # twins point at each other, healthy ones expect nothing
    twin = BY_FILE.get(cap["twin"])
    assert twin is not None, f"twin {cap['twin']} not in manifest"
    assert twin["healthy"] != cap["healthy"]
    import make_real  # noqa: PLC0415
    if make_real.SCENARIOS[cap["scenario"]][4]:
        assert twin["twin"] == cap["file"] and twin["scenario"] == cap["scenario"]
    else:  # a variant without a twin of its own names another scenario's healthy capture
        assert twin["healthy"] and not cap["healthy"]
    assert set(cap["silent"]) <= DETECTORS
    if cap["healthy"]:
        assert cap["expect"] == []
        assert set(cap["silent"]) >= {d for e in twin["expect"] for d in [e["detector"]]}
    else:
        assert cap["expect"], "a pathological capture must expect at least one finding"
    for e in cap["expect"]:
        for key, typ in EXPECT_KEYS.items():
            assert key in e, f"expect: missing key {key}"
            assert isinstance(e[key], typ), f"expect.{key} should be {typ}"
        assert e["detector"] in DETECTORS
        assert e["detector"] not in cap["silent"]
        assert e["min_severity"] in SEVERITIES
        assert e["start_s"] >= 0 and e["tolerance_s"] > 0
        assert e["count"] >= 1 and 0 <= e["count_tolerance"] <= e["count"]
        # the server address is always known; a fan-in (incast: many servers answering one client) names
        # its client instead, and its resource says "client <- servers"
        assert e["server"] or (e["detector"] == "incast" and e["client"]), "server address is always known"
        assert e["resource"]


@pytest.mark.tshark
@pytest.mark.skipif(not HAVE_TSHARK, reason="tshark is not installed")
@pytest.mark.parametrize("cap", CAPTURES, ids=lambda c: c["file"])
def test_tshark_reads_capture_and_confirms_ground_truth(cap):
    path = SAMPLES / cap["file"]
    frames, _ = _frames(path)
    assert frames == cap["tshark"]["frames_total"]
    problems = _check_facts(cap, path, cap)
    assert not problems, "\n".join(problems)


@pytest.mark.tshark
@pytest.mark.skipif(not HAVE_TSHARK, reason="tshark is not installed")
@pytest.mark.parametrize("cap", [c for c in CAPTURES if not c["healthy"]],
                         ids=lambda c: c["file"])
def test_expected_findings_lie_inside_the_capture(cap):
    _, duration = _frames(SAMPLES / cap["file"])
    for e in cap["expect"]:
        assert 0 <= e["start_s"] <= duration, f"{e['detector']} at {e['start_s']} s"


# --------------------------------------------------------------------------- rebuild
def _can_rebuild() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not HAVE_TSHARK:
        return "needs tshark"
    p = subprocess.run([sys.executable, str(SAMPLES / "make_real.py"), "--check"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return "requirements missing: " + p.stderr.strip().replace("\n", " ")
    return None


@pytest.mark.real_samples
def test_rebuilt_captures_match_the_manifest(tmp_path):
    why = _can_rebuild()
    if why:
        pytest.skip(why)
    argv = [sys.executable, str(SAMPLES / "make_real.py"), "--out", str(tmp_path)]
    only = os.environ.get("HERDSCOPE_REAL_ONLY", "")
    if only:
        argv += ["--only", only]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    fresh = tomllib.loads((tmp_path / "MANIFEST.toml").read_text())["capture"]
    assert fresh
    if not only:
        assert {c["file"] for c in fresh} == set(BY_FILE)
    problems = []
    for new in fresh:
        old = BY_FILE[new["file"]]
        path = tmp_path / new["file"]
        if path.stat().st_size >= MAX_BYTES:
            problems.append(f"{new['file']}: {path.stat().st_size} bytes")
        problems += [f"{new['file']}: {p}" for p in _check_facts(new, path, old)]
        # the same kinds of findings, on the same servers and resources
        want = {(e["detector"], e["server"]) for e in old["expect"]}
        got = {(e["detector"], e["server"]) for e in new["expect"]}
        if want != got:
            problems.append(f"{new['file']}: expected findings {got}, manifest has {want}")
        if len(old["expect"]) == len(new["expect"]):
            for eo, en in zip(old["expect"], new["expect"]):
                slack = eo["tolerance_s"] + 1.5   # wall-clock alignment differs between runs
                if abs(eo["start_s"] - en["start_s"]) > slack:
                    problems.append(f"{new['file']}: {eo['detector']} starts at "
                                    f"{en['start_s']} s, manifest {eo['start_s']} s")
        if set(old["silent"]) != set(new["silent"]):
            problems.append(f"{new['file']}: silent detectors differ")
    assert not problems, "\n".join(problems)
