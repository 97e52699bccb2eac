"""Detectors: one module per timing pathology, and the registry that runs them.

    from analyzer import open_capture
    from detectors import run
    findings = run(open_capture("trace.pcap"))                       # every detector, defaults
    findings = run(cap, only=["herd"], overrides={"herd.min_clients": 50})

See ``detectors/base.py`` for the contract every detector follows and ``detectors/README.md`` for how
to add one. The detectors are found, not listed: a module of this package that declares the contract
(:data:`CONTRACT`) is a detector; :func:`register` adds one from elsewhere (a test's throwaway).
:func:`run` hands each detector a :class:`~detectors.base.CaptureView` of its ``REQUIRES`` (any other
frame is :class:`~detectors.base.UndeclaredFrame`); what gets built is what the detectors read through
their views, which tests/test_detector_contract.py checks against :func:`required_frames`. A finding
whose ``kind`` is not among its detector's ``KINDS`` is an error of that detector (:func:`run`).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import pkgutil

import polars as pl

from analyzer.kernels.silences import SPAN_ONLY_NS
from analyzer.narrowing import build_and_release, build_frames
from analyzer.capture import READER_FRAMES
from analyzer.partitions import CONNECTION_FRAMES, decode_partition, merge_columns
from analyzer.shards import SERVER_STATE_COLUMNS, SERVER_STATE_FRAMES, shard_frames
from analyzer.progress import stage
from analyzer.threads import run_each

from .base import (FINDINGS_SCHEMA, PACKET_COLUMNS, SEVERITY_RANK, CaptureView, UndeclaredFrame,  # noqa: F401
                   empty_findings, rows_among, view)
from . import incidents, population
from .params import ParameterError, check_declared, describe_params, make_params

log = logging.getLogger(__name__)

# What makes a module a detector: it defines all of these (base.py says what each is). A module that
# defines ``detect`` or ``KINDS`` but not all the others is a half-declared detector: an error, never a skip.
CONTRACT = ("NAME", "detect", "Params", "REQUIRES", "KINDS")
# NAMEs the detectors cannot take: the population step's parameters are set as population.*, the
# incident linker's (detectors/incidents.py) as incident.*
RESERVED_NAMES = (population.NAME, incidents.NAME)

# what a detector's PARTITION may say (base.py): None, or decomposable by server partition or by client bucket
PARTITIONS = (None, "server", "client")
# a detector in two steps (base.py: partial on each partition, finish on their parts concatenated) hands
# back its parts as "NAME:PART" among the findings of detect_frames
PART_SEPARATOR = ":"
# what a detector partitioned by client may read: connection frames (each bucket's own) and the interfaces
CLIENT_BUCKET_FRAMES = (*CONNECTION_FRAMES, "interfaces")
# what a detector run on a server's shards reads (SHARDS, base.py): its connections and the capture's times
SHARD_FRAMES = (*CONNECTION_FRAMES, "packets", "interfaces")

_REGISTRY: dict[str, object] | None = None  # NAME -> module, filled by discovery on first use


def is_detector(module) -> bool:
    """Whether ``module`` declares the detector contract. A module that defines ``detect`` or ``KINDS``
    (what only a detector defines) without the whole contract raises TypeError: a half-declared
    detector is an error, never silently skipped."""
    present = [a for a in CONTRACT if hasattr(module, a)]
    marks = [a for a in ("detect", "KINDS") if a in present]
    if marks and len(present) < len(CONTRACT):
        missing = [a for a in CONTRACT if a not in present]
        raise TypeError(f"{getattr(module, '__name__', module)!r} defines {' and '.join(marks)} but not "
                        f"{', '.join(missing)} (a detector declares {', '.join(CONTRACT)}; see detectors/base.py)")
    return len(present) == len(CONTRACT)


def check_contract(module) -> None:
    """Raise TypeError unless ``module`` declares the detector contract completely and well: NAME a
    plain name, ``detect`` callable, every ``Params`` field declared with param() and valid, KINDS
    and REQUIRES non-empty tuples of names, ORDER (when given) a number, and a POPULATION
    declaration only with the frames the population step reads among its REQUIRES."""
    where = getattr(module, "__name__", repr(module))
    if not is_detector(module):
        raise TypeError(f"{where} is not a detector: it declares none of {', '.join(CONTRACT)}")
    name = module.NAME
    if not isinstance(name, str) or not name.isidentifier() or name in RESERVED_NAMES:
        raise TypeError(f"{where}.NAME must be a plain name other than {', '.join(RESERVED_NAMES)}: {name!r}")
    if not callable(module.detect):
        raise TypeError(f"{where}.detect is not a function")
    check_declared(module.Params)
    for attr in ("KINDS", "REQUIRES"):
        value = getattr(module, attr)
        if not isinstance(value, tuple) or not value or not all(isinstance(v, str) and v for v in value):
            raise TypeError(f"{where}.{attr} must be a non-empty tuple of names: {value!r}")
    order = getattr(module, "ORDER", None)
    if order is not None and (isinstance(order, bool) or not isinstance(order, (int, float))):
        raise TypeError(f"{where}.ORDER must be a number: {order!r}")
    if getattr(module, "PARTITION", None) not in PARTITIONS:
        raise TypeError(f"{where}.PARTITION must be one of {PARTITIONS}: {module.PARTITION!r}")
    beyond = sorted(set(module.REQUIRES) - set(CLIENT_BUCKET_FRAMES))
    if getattr(module, "PARTITION", None) == "client" and beyond:
        raise TypeError(f"{where}.PARTITION is 'client', but a client bucket holds {', '.join(CLIENT_BUCKET_FRAMES)}, "
                        f"not {', '.join(beyond)}")
    beyond = sorted(set(module.REQUIRES) - set(SHARD_FRAMES))
    if getattr(module, "SHARDS", False) and (getattr(module, "PARTITION", None) != "server" or beyond):
        raise TypeError(f"{where}.SHARDS needs PARTITION = 'server' and a shard holds {', '.join(SHARD_FRAMES)}, "
                        f"not {', '.join(beyond) or 'other frames'} (base.py)")
    uncovered = getattr(module, "UNCOVERED_SEGMENTS", None)
    if uncovered is not None and not (isinstance(uncovered, tuple) and set(uncovered) <= set(module.REQUIRES)):
        raise TypeError(f"{where}.UNCOVERED_SEGMENTS must be a tuple of frames among its REQUIRES: {uncovered!r}")
    rows = getattr(module, "ROWS", None)
    if rows is not None and not (isinstance(rows, dict) and set(rows) <= set(module.REQUIRES)
                                 and all(isinstance(e, pl.Expr) for e in rows.values())):
        raise TypeError(f"{where}.ROWS must map frames among its REQUIRES to Polars expressions: {rows!r}")
    silence = getattr(module, "SILENCE", None)
    if silence is not None and silence not in {f.name for f in dataclasses.fields(module.Params)}:
        raise TypeError(f"{where}.SILENCE must name one of its Params (the shortest silence it looks for, "
                        f"in ns): {silence!r}")
    steps = [callable(getattr(module, a, None)) for a in ("partial", "finish")]
    if any(steps) and not (all(steps) and getattr(module, "PARTITION", None) == "server"):
        raise TypeError(f"{where} defines partial or finish: a detector in two steps defines both, with "
                        f"PARTITION = 'server' (base.py)")
    if getattr(module, "POPULATION", None):
        missing = set(population.REQUIRES) - set(module.REQUIRES)
        if missing:
            raise TypeError(f"{where} declares POPULATION, whose step reads {', '.join(sorted(missing))}: "
                            f"add it to {where}.REQUIRES")


def _sort_key(module) -> tuple:
    order = getattr(module, "ORDER", None)
    return (math.inf if order is None else order, module.NAME)


def _ordered(found: dict[str, object]) -> dict[str, object]:
    return {m.NAME: m for m in sorted(found.values(), key=_sort_key)}


def discover() -> dict[str, object]:
    """Import every module of this package and keep those that declare the contract (helpers such
    as base, params and population do not), checked and in ``ORDER``; replaces what
    :func:`register` added. An import error of any module propagates: a detector that fails to
    import is an error, not a missing detector."""
    global _REGISTRY
    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if not is_detector(module):
            continue
        check_contract(module)
        if module.NAME in found:
            raise TypeError(f"two detector modules are named {module.NAME!r}: "
                            f"{found[module.NAME].__name__} and {module.__name__}")
        found[module.NAME] = module
    _REGISTRY = _ordered(found)
    return dict(_REGISTRY)


def available() -> dict[str, object]:
    """NAME -> module for every detector (discovered, plus any :func:`register` added), in the order
    they run and are listed."""
    if _REGISTRY is None:
        discover()
    return dict(_REGISTRY)


def register(module) -> object:
    """Add a detector module from anywhere (a test's throwaway detector): checked like a discovered
    one; a module of the same NAME is replaced. Returns the module."""
    check_contract(module)
    found = available()
    found[module.NAME] = module
    global _REGISTRY
    _REGISTRY = _ordered(found)
    return module


def unregister(name: str) -> None:
    """Remove a detector by NAME (what :func:`register` added; :func:`discover` brings back a
    discovered one)."""
    global _REGISTRY
    found = available()
    found.pop(name, None)
    _REGISTRY = found


def required_frames(only: list[str] | None = None) -> tuple[str, ...]:
    """The frames running these detectors (all by default) reads, as declared: their ``REQUIRES``,
    and the population step's where one of them declares a POPULATION (a subset of its own,
    :func:`check_contract`). What a run builds is what its detectors read through their views (and
    what those frames are built from); tests/test_detector_contract.py checks it is no more than these."""
    detectors = available()
    names = list(detectors) if only is None else list(only)
    out: dict[str, None] = {}
    for name in names:
        module = detectors[name]
        out.update(dict.fromkeys(module.REQUIRES))
        if getattr(module, "POPULATION", None):
            out.update(dict.fromkeys(population.REQUIRES))
    return tuple(out)


def configure(only: list[str] | None = None, overrides: dict[str, object] | None = None) -> dict[str, object]:
    """NAME -> Params for the selected detectors (all by default), checked without reading a capture:
    unknown detectors, unknown parameters and bad values raise ParameterError."""
    detectors = available()
    overrides = overrides or {}
    unknown_owner = {k.partition(".")[0] for k in overrides} - set(detectors) - set(RESERVED_NAMES)
    if unknown_owner:
        raise ParameterError(f"no detector named {', '.join(sorted(unknown_owner))} "
                             f"(known: {', '.join(detectors)})")
    names = list(detectors) if only is None else list(only)
    if not names:
        raise ParameterError(f"no detector selected (known: {', '.join(detectors)})")
    missing = [n for n in names if n not in detectors]
    if missing:
        raise ParameterError(f"unknown detector(s): {', '.join(missing)} (known: {', '.join(detectors)})")
    make_params(population, overrides)  # population.* and incident.* overrides checked here too
    make_params(incidents, overrides)
    return {n: make_params(detectors[n], overrides) for n in dict.fromkeys(names)}


def run(capture, only: list[str] | None = None, overrides: dict[str, object] | None = None,
        errors: dict[str, str] | None = None, *, release: bool = False,
        found_elsewhere: dict[str, pl.DataFrame] | None = None) -> pl.DataFrame:
    """Run the selected detectors (all by default), then group their findings into populations
    (``detectors/population.py``; ``population.*`` overrides set its parameters). Returns every
    finding, population members included (``member_of`` set): :func:`top_level` is what a listing
    shows and ``--fail-on`` counts, :func:`expanded` puts each population's members beneath it.
    Worst first (:func:`worst_first`).

    ``errors``: when given (the dashboard), a detector that raises is recorded there (name ->
    "Type: message") and the others' findings are still returned; otherwise the exception propagates
    (the CLI reports it as the bug it is). A finding whose ``kind`` is not in its detector's
    ``KINDS`` is such a failure (TypeError).

    ``release`` (a scan, which needs nothing of the capture afterwards but its span and frame
    numbers): build what reads ``packets`` first (``analyzer.packet_readers``) and narrow it to
    ``(frame, ts_ns)``, and ``tcp_segments`` to the columns its readers declare (:func:`narrow_to_declared`),
    build every frame the detectors read, then free the rest (``Capture.release``: the other columns of
    ``packets``, the builders' memos; every frame narrowed to its readers' columns) and drop each frame
    once every detector that reads it has returned. The findings are the same; the memory is not (issue 13).

    The frames are built, and the detectors run, several at once (``analyzer.threads``); the findings
    are in the order above whatever order they finish in.

    ``found_elsewhere``: detector name -> its findings, already found (``scan --workers`` runs the
    detectors that declare a PARTITION on the workers, :func:`detect_partition`); those are not run
    again here, and their frames are not built. A detector in two steps is there as its parts
    ("NAME:PART", each concatenated over the partitions), which its ``finish`` makes its findings
    here (:func:`finished`)."""
    detectors = available()
    configured = configure(only, overrides)
    found_elsewhere = finished(found_elsewhere or {}, capture, configured)
    to_run = [n for n in configured if n not in found_elsewhere]
    if release:
        needed, readers, declared = _reads(configured, list(found_elsewhere))
        # what reads packets' other columns first (TCP analysis, the memos the decoders read), then
        # packets, and those frames (what is built from them is), narrowed to what is still read of them
        build_and_release(capture, needed, PACKET_COLUMNS, declared)
        narrow_to_declared(capture, readers, needed)

    def detection(name: str):
        def detect():
            stage(f"detector {name}")
            module = detectors[name]
            try:
                return _checked_kinds(module, module.detect(view(capture, module), configured[name]))
            except Exception as exc:  # noqa: BLE001 - recorded for the caller that asked for it
                if errors is None:
                    raise
                log.exception("detector %s", name)
                return exc
        return detect

    done = _dropping_read_frames(capture, to_run) if release else None
    found = dict(zip(to_run, run_each([detection(n) for n in to_run], done=done)))
    frames = []
    for name in configured:
        result = found_elsewhere[name] if name in found_elsewhere else found[name]
        if isinstance(result, Exception):
            errors[name] = f"{type(result).__name__}: {result}"
        else:
            frames.append(result)
    frames = [f for f in frames if f.height]
    if not frames:
        return empty_findings()
    found = pl.concat([f.select(FINDINGS_SCHEMA.names()).cast(FINDINGS_SCHEMA) for f in frames])
    found = population.apply(found, view(capture, population), detectors,
                             configured, population_params(overrides))
    return worst_first(found)


def frames_read_here(names: list[str], found_elsewhere: list[str]) -> tuple[str, ...]:
    """The frames a run of ``names`` reads when ``found_elsewhere``'s findings come from elsewhere: the
    other detectors' and, where any of ``names`` declares a POPULATION, the population step's."""
    detectors = available()
    here = [n for n in names if n not in found_elsewhere]
    out = dict.fromkeys(required_frames(here) if here else ())
    if any(getattr(detectors[n], "POPULATION", None) for n in names):
        out.update(dict.fromkeys(population.REQUIRES))
    return tuple(out)


def partitioned(names: list[str], key: str = "server") -> list[str]:
    """Those of ``names`` that declare ``PARTITION = key`` (base.py)."""
    detectors = available()
    return [n for n in names if getattr(detectors[n], "PARTITION", None) == key]


def shortest_silence_ns(configured: dict[str, object]) -> int:
    """Of the whole capture's packet times, what detectors ``configured`` (name -> Params) need on a
    server partition (base.py, PARTITION): the shortest silence any of them looks for (its ``SILENCE``
    parameter), or ``SPAN_ONLY_NS`` when none does (the first and last times only)."""
    detectors = available()
    lengths = [int(getattr(params, detectors[name].SILENCE)) for name, params in configured.items()
               if getattr(detectors[name], "SILENCE", None)]
    return min(lengths, default=SPAN_ONLY_NS)


def detect_partition(capture, whole_packets: pl.DataFrame, names: list[str],
                     overrides: dict[str, object] | None = None) -> dict[str, pl.DataFrame]:
    """The findings of detectors ``names`` (each declaring PARTITION) on one server partition of a
    capture, its frames built: ``capture.packets`` is put back to the whole capture's ``whole_packets``
    (frame, ts_ns) first, so spans and rates are the capture's (base.py, PARTITION)."""
    needed, readers = required_frames(names), [available()[n] for n in names]
    build_frames(capture, needed, declared_columns_of(readers, needed))
    capture.release(needed, PACKET_COLUMNS)  # the partition's own packets and the builders' memos
    narrow_to_declared(capture, readers, needed)
    capture.set_frame("packets", whole_packets.select(PACKET_COLUMNS))
    return detect_frames(capture, names, overrides, release=True)


def sharded(names: list[str]) -> list[str]:
    """Those of ``names`` that run on the shards of a server cut by client (``SHARDS``, base.py)."""
    detectors = available()
    return [n for n in names if getattr(detectors[n], "SHARDS", False)]


def detect_merged(frames, names: list[str], overrides: dict[str, object] | None = None) -> dict[str, pl.DataFrame]:
    """The findings of detectors ``names`` (each declaring PARTITION = "server") on a cut server's shards
    merged (``analyzer.distributed.server_task``: its frames, ``packets`` the whole capture's times)."""
    frames.set_frame("packets", frames.packets.select(PACKET_COLUMNS))
    return detect_frames(frames, names, overrides, release=True)


def detect_frames(capture, names: list[str], overrides: dict[str, object] | None = None, *,
                  release: bool = False) -> dict[str, pl.DataFrame]:
    """The findings of detectors ``names`` on ``capture`` as it is (a partition, or the frames of a client
    bucket, ``analyzer.partitions.FrameSet``), by detector name, run several at once
    (``analyzer.threads``). ``release``: each frame is dropped once every one of them that reads it has
    returned (a partition's capture, which nothing reads afterwards)."""
    detectors = available()
    configured = configure(names, overrides)

    def detection(name: str):
        def detect() -> dict[str, pl.DataFrame]:
            module, params = detectors[name], configured[name]
            seen = view(capture, module)
            if hasattr(module, "partial"):  # in two steps: its parts, finished where they meet (finished)
                return {f"{name}{PART_SEPARATOR}{part}": frame for part, frame in module.partial(seen, params).items()}
            return {name: _checked_kinds(module, module.detect(seen, params))}
        return detect

    order = list(configured)
    done = _dropping_read_frames(capture, order) if release else None
    out: dict[str, pl.DataFrame] = {}
    for found in run_each([detection(n) for n in order], done=done):
        out.update(found)
    return out


def _reads(configured: dict[str, object], elsewhere: list[str]) -> tuple[tuple[str, ...], list, dict]:
    """What a run of ``configured`` (name -> Params) reads here when ``elsewhere``'s findings come from
    elsewhere: the frames (:func:`frames_read_here`), their readers (the detectors run here and the
    population step), and what those declare they read of each frame (:func:`declared_columns_of`)."""
    detectors = available()
    needed = frames_read_here(list(configured), elsewhere)
    readers = [detectors[n] for n in configured if n not in elsewhere] + [population]
    return needed, readers, declared_columns_of(readers, needed)


def finished(found: dict[str, pl.DataFrame], capture, configured: dict[str, object]) -> dict[str, pl.DataFrame]:
    """``found`` (detector name -> findings, and "NAME:PART" -> the parts of a detector in two steps,
    each concatenated over the partitions) with each such detector's parts made its findings by its
    ``finish`` (base.py, PARTITION), which reads of ``capture`` what its REQUIRES allow."""
    detectors = available()
    out: dict[str, pl.DataFrame] = {}
    parts: dict[str, dict[str, pl.DataFrame]] = {}
    for key, frame in found.items():
        name, separated, part = key.partition(PART_SEPARATOR)
        if separated:
            parts.setdefault(name, {})[part] = frame
        else:
            out[key] = frame
    for name, its_parts in parts.items():
        module = detectors[name]
        out[name] = _checked_kinds(module, module.finish(its_parts, view(capture, module),
                                                         configured[name]))
    return out


def declared_columns(readers: list, frame: str) -> frozenset[str] | None:
    """The columns of ``frame`` its readers among ``readers`` (detector modules, and the population
    step) declare in their COLUMNS (base.py), all of them together; None when one of them reads it
    whole, or none reads it."""
    using = [m for m in readers if frame in m.REQUIRES]
    declared = [getattr(m, "COLUMNS", {}).get(frame) for m in using]
    if not using or any(d is None for d in declared):
        return None
    return frozenset().union(*declared)


def declared_columns_of(readers: list, frames) -> dict[str, frozenset[str]]:
    """frame -> :func:`declared_columns` of those of ``frames`` whose readers all declare some."""
    return {f: c for f in frames if (c := declared_columns(readers, f)) is not None}


def narrow_to_declared(capture, readers: list, frames) -> None:
    """Keep of each of ``frames`` only the columns its readers among ``readers`` declare
    (:func:`declared_columns`; a frame one of them reads whole is left as it is)."""
    for frame, wanted in declared_columns_of(readers, frames).items():
        capture.narrow_frame(frame, wanted)


def _dropping_read_frames(capture, names: list[str]):
    """``done(i)`` for ``run_each`` of detectors ``names``: drops from ``capture`` each frame once every
    one of them that reads it has returned (one after the other: after the last, in run order); the
    frames the population step reads are kept to the end."""
    detectors = available()
    readers_left: dict[str, int] = {}
    for name in names:
        for frame in set(detectors[name].REQUIRES):
            readers_left[frame] = readers_left.get(frame, 0) + 1
    for frame in population.REQUIRES:
        readers_left.pop(frame, None)

    def done(index: int) -> None:
        read = [f for f in set(detectors[names[index]].REQUIRES) if f in readers_left]
        for frame in read:
            readers_left[frame] -= 1
        capture.drop([f for f in read if readers_left[f] == 0])
    return done


def _checked_kinds(module, found: pl.DataFrame) -> pl.DataFrame:
    """``found`` unchanged; TypeError when a finding's ``kind`` is not one of ``module.KINDS``."""
    if found.height and "kind" in found.columns:
        kinds = found.get_column("kind").cast(pl.String).unique().drop_nulls().to_list()
        undeclared = sorted(set(kinds) - set(module.KINDS))
        if undeclared:
            raise TypeError(f"detector {module.NAME!r} returned findings of kind {', '.join(map(repr, undeclared))}, "
                            f"which its KINDS does not declare ({', '.join(module.KINDS)}); add them to "
                            f"{module.NAME}.KINDS")
    return found


def population_params(overrides: dict[str, object] | None = None) -> population.Params:
    """The population step's Params with the ``population.*`` overrides applied (ParameterError)."""
    return make_params(population, overrides or {})


def incident_params(overrides: dict[str, object] | None = None) -> incidents.Params:
    """The incident linker's Params with the ``incident.*`` overrides applied (ParameterError)."""
    return make_params(incidents, overrides or {})


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
    population step's parameters (``--set population.min_members=10``), under ``population``, then the
    incident linker's (``--set incident.lag_ns=2s``), under ``incident``."""
    out = []
    for module in [*available().values(), population, incidents]:
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


# what a shard of a cut server hands over and its task keeps: handing.py (it reads the registry above)
from .handing import hand_over, server_frames, server_read_columns  # noqa: E402,F401
