"""Typed detector parameters: every field declared, values parsed and range-checked, the listing
generated from the declarations."""
from __future__ import annotations

import dataclasses
import json

import pytest

import detectors
from analyzer.cli import main
from detectors.params import (LOWER, UPPER, ParameterError, coerce, describe_params, fields_of, kind_of,
                              parse_assignment, parse_duration_ns, spec_of)

MODULES = detectors.available()


def test_the_registry_has_every_detector_module():
    # found by discovery (detectors/__init__.py); a module that fails to import must not silently
    # disappear from the list (tests/test_detector_contract.py checks discovery itself)
    assert list(MODULES) == ["herd", "replay", "retry_storm", "smb_break_queue", "delegation_recall", "lock_polling",
                             "saturation", "tcp_stall", "incast",
                             "toctou", "replication_conflict", "conn_churn", "pfc_storm", "gbn_retransmission",
                             "rnr_retry", "ecn_congestion"]


@pytest.mark.parametrize("name", list(MODULES))
def test_every_parameter_is_declared_with_meaning_unit_and_valid_default(name):
    module = MODULES[name]
    assert module.KINDS, f"{name} declares no KINDS"
    for f in fields_of(module.Params):
        spec = spec_of(f)  # raises if not declared with param()
        assert spec.help.strip(), f"{name}.{f.name} has no meaning"
        coerce(f, f.default, name)  # the default is inside its own range
        if f.name.endswith("_ns"):
            assert kind_of(f) == "duration", f"{name}.{f.name} ends in _ns but is not a duration"
        if spec.gate is not None:
            assert spec.gate in (LOWER, UPPER)
            assert kind_of(f) in ("int", "float", "duration"), f"{name}.{f.name}: only numbers gate"


@pytest.mark.parametrize("text, ns", [
    ("1s", 1_000_000_000), ("250ms", 250_000_000), ("20us", 20_000), ("20µs", 20_000), ("1.5min", 90 * 10**9),
    ("100ns", 100), ("1000", 1000), (1000, 1000), (2.0, 2), ("1_000ms", 10**9), ("0.5s", 500_000_000),
])
def test_durations_take_units(text, ns):
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["3 parsecs", "1.5ns", "-", "ms", "", True])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration_ns(text)


@pytest.mark.parametrize("override, message", [
    ({"herd.min_clients": "-5"}, "below the smallest allowed value"),
    ({"herd.rate_factor": "-1"}, "below the smallest allowed value"),
    ({"herd.min_clients": "2.5"}, "is not an integer"),
    ({"herd.min_clients": 2.5}, "is not an integer"),  # a TOML float
    ({"herd.error_rate_rise": "1.5"}, "above the largest allowed value"),
    ({"herd.window_ns": "3parsecs"}, "unknown unit"),
    ({"herd.no_such": "1"}, "has no parameter"),
    ({"nosuch.x": "1"}, "no detector named nosuch"),
    ({"toctou.stale_use_severity": "severe"}, "is not one of"),
    ({"conn_churn.one_shot_ports": "53,x"}, "is not a list of integers"),
    ({"conn_churn.one_shot_ports": "70000"}, "above the largest allowed value"),
])
def test_bad_values_are_parameter_errors(override, message):
    with pytest.raises(ParameterError, match=message):
        detectors.configure(None, override)


def test_good_values_are_typed():
    p = detectors.configure(None, {"herd.window_ns": "250ms", "herd.min_clients": "1e2",
                                   "conn_churn.one_shot_ports": "53, 88", "toctou.stale_use_severity": "high",
                                   "herd.rate_factor": 3})
    assert p["herd"].window_ns == 250_000_000 and p["herd"].min_clients == 100
    assert isinstance(p["herd"].rate_factor, float)
    assert p["conn_churn"].one_shot_ports == frozenset({53, 88})
    assert p["toctou"].stale_use_severity == "high"


def test_empty_selection_is_an_error_not_everything():
    with pytest.raises(ParameterError, match="no detector selected"):
        detectors.configure([], {})


@pytest.mark.parametrize("text", ["herd.min_clients", "min_clients=3", "herd.=3", ".x=3", "herd.min_clients="])
def test_malformed_assignments(text):
    with pytest.raises(ParameterError):
        parse_assignment(text)


def test_describe_lists_every_parameter_of_every_detector():
    rows = {d["name"]: d for d in detectors.describe()}
    assert list(rows) == [*MODULES, "population", "incident"]  # the population step's, the linker's last
    assert [p["name"] for p in rows["population"]["parameters"]] == [
        f.name for f in dataclasses.fields(detectors.population.Params)]
    assert [p["name"] for p in rows["incident"]["parameters"]] == [
        f.name for f in dataclasses.fields(detectors.incidents.Params)]
    for name, module in MODULES.items():
        listed = [p["name"] for p in rows[name]["parameters"]]
        assert listed == [f.name for f in dataclasses.fields(module.Params)]
        assert rows[name]["requires"] == list(module.REQUIRES)
    herd = {p["name"]: p for p in rows["herd"]["parameters"]}
    assert herd["window_ns"]["default"] == "1s" and herd["window_ns"]["kind"] == "duration"
    assert herd["min_clients"]["gate"] == "lower" and herd["min_clients"]["lo"] == "1"


def test_detectors_command_json(capsys):
    assert main(["detectors", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in doc["detectors"]] == [*MODULES, "population", "incident"]
    total = sum(len(describe_params(m.Params)) for m in [*MODULES.values(), detectors.population,
                                                           detectors.incidents])
    assert sum(len(d["parameters"]) for d in doc["detectors"]) == total


def test_detectors_command_table_names_every_parameter(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["detectors", "tcp_stall"]) == 0
    out = capsys.readouterr().out
    for f in fields_of(MODULES["tcp_stall"].Params):
        assert f.name in out
    assert "herd" not in out.split("\n", 1)[0]


def test_detectors_command_unknown_name_is_usage(capsys):
    assert main(["detectors", "nosuch"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--set", "herd.min_clients=-5"], "herd.min_clients"),
    (["--set", "herd.min_clients=2.5"], "not an integer"),
    (["--detectors", ""], "no detector named"),
    (["--detectors", " , "], "no detector named"),
    (["--detectors", "nosuch"], "unknown detector"),
    (["--set", "herd.min_clients"], "DETECTOR.PARAMETER=VALUE"),
])
def test_scan_refuses_bad_configuration_before_reading(args, message, capsys, tmp_path):
    missing = tmp_path / "never-read.pcap"  # not even opened: the configuration is checked first
    assert main(["scan", *args, str(missing)]) == 2
    assert message in capsys.readouterr().err


def test_config_file_values_are_checked(tmp_path, capsys):
    cfg = tmp_path / "h.toml"
    cfg.write_text('[scan]\ndetectors = "herd"\n')
    assert main(["scan", "--config", str(cfg), str(tmp_path / "x.pcap")]) == 2
    cfg.write_text('[herd]\nwindow_ns = "250ms"\nmin_clients = 0\n')
    assert main(["scan", "--config", str(cfg), str(tmp_path / "x.pcap")]) == 2
    assert "herd.min_clients" in capsys.readouterr().err
