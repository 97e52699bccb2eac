"""The configuration of ``herdscope scan`` and ``show``: which detectors run, with what parameters,
and from which severity a finding fails the run, from ``--config`` (a TOML file such as
``herdscope.toml``), ``--set``, ``--detectors`` and ``--fail-on``.

The file::

    [scan]
    detectors = ["herd", "retry_storm"]
    fail_on = "medium"

    [herd]
    min_clients = 50
    window_ns = "250ms"
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

import click

from . import configure
from .base import SEVERITIES
from .params import parse_assignment

DEFAULT_FAIL_ON = "high"  # the severity from which `scan` exits 1 unless --fail-on or [scan] fail_on says


@dataclass
class ScanConfig:
    detectors: list[str] | None = None
    overrides: dict[str, object] = field(default_factory=dict)
    fail_on: str = DEFAULT_FAIL_ON


def load_config(path: str | None, sets: tuple[str, ...], detectors: str | None, fail_on: str | None) -> ScanConfig:
    """Config file first, then the command line (the file's form is in this module's docstring).

    Raises ValueError (a usage error) for a malformed assignment or an empty detector list; names and
    values are checked against the detectors' declarations when they run.
    """
    cfg = ScanConfig()
    if path:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
        scan = doc.pop("scan", {})
        if not isinstance(scan, dict):
            raise ValueError(f"{path}: [scan] must be a table")
        unknown = set(scan) - {"detectors", "fail_on"}
        if unknown:
            raise ValueError(f"{path}: [scan] has no setting {', '.join(sorted(unknown))} "
                             f"(known: detectors, fail_on)")
        if "detectors" in scan:
            listed = scan["detectors"]
            if not isinstance(listed, list) or not all(isinstance(d, str) for d in listed):
                raise ValueError(f"{path}: [scan] detectors must be a list of detector names")
            cfg.detectors = [d.strip() for d in listed]
        cfg.fail_on = scan.get("fail_on", cfg.fail_on)
        for owner, table in doc.items():
            if not isinstance(table, dict):
                raise ValueError(f"{path}: [{owner}] must be a table of parameters")
            for name, value in table.items():
                cfg.overrides[f"{owner}.{name}"] = value
    for item in sets:
        key, value = parse_assignment(item)
        cfg.overrides[key] = value
    if detectors is not None:
        cfg.detectors = [d.strip() for d in detectors.split(",") if d.strip()]
    if cfg.detectors is not None and not cfg.detectors:
        raise ValueError("--detectors: no detector named (`herdscope detectors` lists them)")
    if fail_on:
        cfg.fail_on = fail_on
    return cfg


def scan_config(config_path, sets, detector_list, fail_on) -> ScanConfig:
    """The detectors' configuration from the options, checked before anything is read (a usage
    error otherwise)."""
    try:
        cfg = load_config(config_path, sets, detector_list, fail_on)
        configure(cfg.detectors, cfg.overrides)
    except tomllib.TOMLDecodeError as exc:  # the parser's message does not say which file
        raise click.UsageError(f"--config {config_path}: not valid TOML: {exc}") from exc
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    if cfg.fail_on not in SEVERITIES:
        raise click.UsageError(f"fail_on {cfg.fail_on!r}: expected one of {', '.join(SEVERITIES)}")
    return cfg
