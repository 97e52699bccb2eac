"""Detectors: one module per timing pathology, and the registry that runs them.

    from analyzer import open_capture
    from detectors import run
    findings = run(open_capture("trace.pcap"))                       # every detector, defaults
    findings = run(cap, only=["herd"], overrides={"herd.min_clients": 50})

See ``detectors/base.py`` for the contract every detector follows.
"""
from __future__ import annotations

import dataclasses
import importlib
import typing

import polars as pl

from .base import FINDINGS_SCHEMA, SEVERITY_RANK, empty_findings

# Detector modules, in the order they run (and are listed).
MODULES = ("herd", "retry_storm", "smb_break_queue", "tcp_stall", "toctou", "conn_churn")


def available() -> dict[str, object]:
    """NAME -> module for every detector module present in this installation."""
    found = {}
    for name in MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        found[module.NAME] = module
    return found


class ParameterError(ValueError):
    """A --set / config override that names no parameter or has the wrong type."""


def _coerce(field: dataclasses.Field, raw, owner: str):
    kind = field.type if not isinstance(field.type, str) else eval(field.type, vars(typing))  # noqa: S307
    try:
        if kind is bool and isinstance(raw, str):
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        if kind in (int, float) and isinstance(raw, str):
            return kind(float(raw)) if kind is int else kind(raw)
        if kind in (int, float, bool, str):
            return kind(raw)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"{owner}.{field.name}: {raw!r} is not a {getattr(kind, '__name__', kind)}") from exc
    return raw


def make_params(module, overrides: dict[str, object]):
    """The module's Params with ``overrides`` ({"herd.min_clients": 50}) applied; unknown names raise."""
    base = module.Params()
    fields = {f.name: f for f in dataclasses.fields(base)}
    changes = {}
    for key, raw in overrides.items():
        owner, _, name = key.partition(".")
        if owner != module.NAME:
            continue
        if name not in fields:
            raise ParameterError(f"{key}: {module.NAME} has no parameter {name!r} "
                                 f"(known: {', '.join(sorted(fields))})")
        changes[name] = _coerce(fields[name], raw, owner)
    return dataclasses.replace(base, **changes)


def run(capture, only: list[str] | None = None, overrides: dict[str, object] | None = None) -> pl.DataFrame:
    """Run the selected detectors (all by default); findings sorted by severity then time."""
    detectors = available()
    overrides = overrides or {}
    unknown_owner = {k.partition(".")[0] for k in overrides} - set(detectors)
    if unknown_owner:
        raise ParameterError(f"no detector named {', '.join(sorted(unknown_owner))} "
                             f"(known: {', '.join(detectors)})")
    names = list(detectors) if not only else only
    missing = [n for n in names if n not in detectors]
    if missing:
        raise ParameterError(f"unknown detector(s): {', '.join(missing)} (known: {', '.join(detectors)})")
    frames = [detectors[n].detect(capture, make_params(detectors[n], overrides)) for n in names]
    frames = [f for f in frames if f.height]
    if not frames:
        return empty_findings()
    out = pl.concat([f.select(FINDINGS_SCHEMA.names()).cast(FINDINGS_SCHEMA) for f in frames])
    return out.sort(pl.col("severity").to_physical(), "start_ns", descending=[True, False])


def at_least(findings: pl.DataFrame, severity: str) -> pl.DataFrame:
    """The findings whose severity is ``severity`` or higher."""
    return findings.filter(pl.col("severity").to_physical() >= SEVERITY_RANK[severity])
