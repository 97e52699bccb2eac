"""The proof-chart registry: one module per detector in ``dashboards/proofs``, found by importing the
package, registered with ``@proof_chart``; a detector without one gets its evidence on the time axis."""
from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from dashboards import proofs
from dashboards.proofs import base as proofs_base
from detectors.base import findings as make_findings

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
HERD = SAMPLES / "dns-ttl-herd.pcap"


@dataclasses.dataclass(frozen=True)
class _Params:
    threshold: float = 1.0


def a_finding(cap, detector: str, frames: list[int]) -> dict:
    t0 = int(cap.packets["ts_ns"].min())
    rows = pl.DataFrame([{
        "kind": "x", "severity": "high", "start_ns": t0 + 1_000_000_000, "end_ns": t0 + 2_000_000_000,
        "client": None, "server": None, "resource": None, "clients": 1, "metric": "m", "value": 1.0,
        "threshold": 1.0, "unit": "x", "evidence_frames": frames, "explanation": "constructed",
    }], schema_overrides={"evidence_frames": pl.List(pl.UInt32), "clients": pl.UInt32})
    return make_findings(rows, detector=detector, params=_Params()).row(0, named=True)


def test_every_detector_has_its_proof_in_a_module_named_after_it():
    found = proofs.discover()
    for name in detectors.available():
        assert name in found, f"detector {name} has no proof chart (dashboards/proofs/{name}.py)"
        assert found[name].__module__ == f"dashboards.proofs.{name}"
    assert set(found) <= set(detectors.available())  # no proof for a detector that does not exist


def test_a_proof_module_dropped_into_the_package_is_found(tmp_path, monkeypatch):
    """Discovery reads the package's directory: no list to extend."""
    (tmp_path / "throwaway_h4.py").write_text(textwrap.dedent('''
        from dashboards.charts import empty
        from dashboards.proofs.base import proof_chart

        @proof_chart("throwaway_h4")
        def proof(p):
            return [(empty(f"throwaway proof of {p.finding['detector']}"), "a caption")]
    '''))
    monkeypatch.setattr(proofs, "__path__", [*proofs.__path__, str(tmp_path)])
    try:
        assert "throwaway_h4" in proofs.discover()
        with open_capture(HERD) as cap:
            out = proofs.proof_charts(cap, a_finding(cap, "throwaway_h4", [1]))
        assert [c for _, c in out] == ["a caption"]
        assert out[0][0].to_dict()["title"]["text"] == "throwaway proof of throwaway_h4"
    finally:
        proofs.unregister("throwaway_h4")
        sys.modules.pop("dashboards.proofs.throwaway_h4", None)
    assert "throwaway_h4" not in proofs.registered()


def test_a_second_proof_for_one_detector_is_refused():
    with pytest.raises(ValueError, match="already has a proof chart"):
        @proofs.proof_chart("herd")
        def another(p):  # noqa: ARG001
            return []
    assert proofs.registered()["herd"].__module__ == "dashboards.proofs.herd"


def test_a_detector_without_a_proof_gets_its_evidence_on_the_time_axis():
    with open_capture(HERD) as cap:
        t0 = int(cap.packets["ts_ns"].min())
        frames = [int(f) for f in cap.packets.filter(
            pl.col("ts_ns").is_between(t0 + 1_000_000_000, t0 + 2_000_000_000))["frame"].head(5)]
        assert frames
        (chart, caption), = proofs.proof_charts(cap, a_finding(cap, "nosuch_detector", frames))
        spec = chart.to_dict(validate=True)
        empty_one, = proofs.proof_charts(cap, a_finding(cap, "nosuch_detector", []))
    assert spec["title"]["text"] == "Evidence of nosuch_detector (no proof chart of its own)"
    assert "evidence frame" in caption
    ticks = [u for u in spec["layer"] if u.get("mark", {}).get("type") == "tick"]
    assert len(ticks) == 1
    drawn = spec["datasets"][ticks[0]["data"]["name"]]
    assert sorted(r["frame"] for r in drawn) == sorted(frames)
    assert all(1.0 <= r["t_s"] <= 2.0 for r in drawn)
    # opens on the finding's window with context, as every proof does
    lo, hi = ticks[0]["encoding"]["x"]["scale"]["domain"]
    assert lo < 1.0 and hi > 2.0
    assert "no evidence frames" in empty_one[0].to_dict()["title"]["text"]


def test_detector_params_are_the_findings_own():
    import detectors.herd as herd

    finding = {"parameters": '{"ttl_tolerance_ns": 5000, "min_clients": 7, "gone": 1}'}
    p = proofs.detector_params(finding, herd)
    assert (p.ttl_tolerance_ns, p.min_clients) == (5000, 7)
    assert proofs.detector_params({"parameters": '{"min_clients": -3}'}, herd) == herd.Params()  # invalid: defaults
    assert proofs.detector_params({"parameters": None}, herd) == herd.Params()


def test_no_proof_logic_outside_its_module():
    """The entry point dispatches through the registry: no detector's name is spelled in the code of
    base.py (docstrings aside), nor anywhere in the shared chart builders."""
    import ast

    tree = ast.parse(Path(proofs_base.__file__).read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docstrings}
    charts_dir = Path(proofs_base.__file__).parent.parent / "charts"
    for name in detectors.available():
        assert name not in strings, name
        for path in charts_dir.glob("*.py"):
            assert f'"{name}"' not in path.read_text(), (name, path.name)
