"""Detectors: one module per timing pathology, and the registry that runs them.

    from analyzer import open_capture
    from detectors import run
    findings = run(open_capture("trace.pcap"))                       # every detector, defaults
    findings = run(cap, only=["herd"], overrides={"herd.min_clients": 50})

See ``detectors/base.py`` for the contract every detector follows.
"""
from __future__ import annotations

import importlib
import logging

import polars as pl

from analyzer.progress import stage

from .base import FINDINGS_SCHEMA, SEVERITY_RANK, empty_findings
from . import population
from .params import ParameterError, make_params

log = logging.getLogger(__name__)

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


def configure(only: list[str] | None = None, overrides: dict[str, object] | None = None) -> dict[str, object]:
    """NAME -> Params for the selected detectors (all by default), checked without reading a capture:
    unknown detectors, unknown parameters and bad values raise ParameterError."""
    detectors = available()
    overrides = overrides or {}
    unknown_owner = {k.partition(".")[0] for k in overrides} - set(detectors) - {population.NAME}
    if unknown_owner:
        raise ParameterError(f"no detector named {', '.join(sorted(unknown_owner))} "
                             f"(known: {', '.join(detectors)})")
    names = list(detectors) if only is None else list(only)
    if not names:
        raise ParameterError(f"no detector selected (known: {', '.join(detectors)})")
    missing = [n for n in names if n not in detectors]
    if missing:
        raise ParameterError(f"unknown detector(s): {', '.join(missing)} (known: {', '.join(detectors)})")
    make_params(population, overrides)  # population.* overrides checked here too
    return {n: make_params(detectors[n], overrides) for n in dict.fromkeys(names)}


def run(capture, only: list[str] | None = None, overrides: dict[str, object] | None = None,
        errors: dict[str, str] | None = None) -> pl.DataFrame:
    """Run the selected detectors (all by default), then group their findings into populations
    (``detectors/population.py``; ``population.*`` overrides set its parameters). Returns every
    finding, population members included (``member_of`` set): :func:`top_level` is what a listing
    shows and ``--fail-on`` counts, :func:`expanded` puts each population's members beneath it.
    Worst first (:func:`worst_first`).

    ``errors``: when given (the dashboard), a detector that raises is recorded there (name ->
    "Type: message") and the others' findings are still returned; otherwise the exception propagates
    (the CLI reports it as the bug it is)."""
    detectors = available()
    configured = configure(only, overrides)
    frames = []
    for name, params in configured.items():
        stage(f"detector {name}")
        try:
            frames.append(detectors[name].detect(capture, params))
        except Exception as exc:  # noqa: BLE001 - recorded for the caller that asked for it
            if errors is None:
                raise
            log.exception("detector %s", name)
            errors[name] = f"{type(exc).__name__}: {exc}"
    frames = [f for f in frames if f.height]
    if not frames:
        return empty_findings()
    found = pl.concat([f.select(FINDINGS_SCHEMA.names()).cast(FINDINGS_SCHEMA) for f in frames])
    found = population.apply(found, capture, detectors, configured, population_params(overrides))
    return worst_first(found)


def population_params(overrides: dict[str, object] | None = None) -> population.Params:
    """The population step's Params with the ``population.*`` overrides applied (ParameterError)."""
    return make_params(population, overrides or {})


def top_level(findings: pl.DataFrame) -> pl.DataFrame:
    """The findings a listing shows: ordinary ones and populations, not the populations' members."""
    return findings.filter(pl.col("member_of").is_null())


def expanded(findings: pl.DataFrame) -> pl.DataFrame:
    """Every finding, each population followed by its members (in ``member_ids`` order)."""
    top = worst_first(top_level(findings)).with_row_index("_top")
    if top.height == findings.height:
        return top.drop("_top")
    order = top.select("_top", "member_ids") \
        .explode("member_ids").with_row_index("_pos").select("_top", "_pos", pl.col("member_ids").alias("finding_id"))
    members = findings.filter(pl.col("member_of").is_not_null()).join(order, on="finding_id", how="inner")
    return (pl.concat([top.with_columns(pl.lit(-1, pl.Int64).alias("_pos")),
                       members.select(top.columns + ["_pos"]).cast({"_pos": pl.Int64})], how="vertical_relaxed")
            .sort("_top", "_pos").drop("_top", "_pos"))


def describe() -> list[dict]:
    """Every detector: name, summary (the docstring's first line), kinds, requires and parameters
    (:func:`detectors.params.describe_params`) — what ``herdscope detectors`` prints; last, the
    population step's parameters (``--set population.min_members=10``), under ``population``."""
    from .params import describe_params

    out = []
    for module in [*available().values(), population]:
        doc = (module.__doc__ or "").strip()
        out.append({"name": module.NAME, "summary": doc.splitlines()[0] if doc else "",
                    "kinds": list(getattr(module, "KINDS", ())), "requires": list(getattr(module, "REQUIRES", ())),
                    "parameters": describe_params(module.Params)})
    return out


def at_least(findings: pl.DataFrame, severity: str) -> pl.DataFrame:
    """The findings whose severity is ``severity`` or higher."""
    return findings.filter(pl.col("severity").to_physical() >= SEVERITY_RANK[severity])


def worst_first(findings: pl.DataFrame) -> pl.DataFrame:
    """Findings worst first, then by time; the id breaks every remaining tie, so the order is the
    same on every run and in every process."""
    return findings.sort(pl.col("severity").to_physical(), "start_ns", "finding_id",
                         descending=[True, False, False])
