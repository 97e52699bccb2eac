"""Typed detector parameters: one declaration gives the default, the unit, the range, the direction
and the meaning of every threshold and window.

A detector's ``Params`` is a frozen dataclass whose fields are declared with :func:`param`::

    @dataclass(frozen=True)
    class Params:
        min_clients: int = param(20, "distinct clients a herd needs at least", unit="clients",
                                 gate=LOWER, lo=1)
        window_ns: int = param(1_000_000_000, "min_clients within this gives the lowest herd rate",
                               unit="ns", lo=1)

The declaration is what ``--set``, ``herdscope.toml``, the dashboard's settings and ``herdscope
detectors`` read, so the listing cannot drift from the code:

- **kind** comes from the default: ``bool``, ``int``, ``float``, ``str`` (with ``choices``), a
  duration (an ``int`` in ns, declared with ``unit="ns"``; ``1s``, ``250ms``, ``20us`` are accepted),
  or a set of integers (a ``frozenset`` default; ``53,88,464`` or a TOML list).
- **range** ``lo``/``hi`` (inclusive): an override outside it is a :class:`ParameterError`.
- **gate**: how the parameter gates findings. ``LOWER``: it is a lower bound on what is measured
  (a finding, or a severity step, needs the measure at or above it), so lowering it never removes or
  downgrades a finding and raising it never adds one. ``UPPER``: an upper bound (a finding needs the
  measure at or below it), the other way round. ``None``: a window or shape parameter, with no
  promised direction. ``tests/test_params_monotonic.py`` holds every gate to its promise.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

LOWER = "lower"
UPPER = "upper"
GATES = (LOWER, UPPER, None)
META_KEY = "herdscope"


class ParameterError(ValueError):
    """A --set / config override that names no parameter, has the wrong type or is out of range."""


@dataclass(frozen=True)
class Spec:
    """What a parameter is, beyond its default (stored in the dataclass field's metadata)."""

    help: str
    unit: str = ""
    gate: str | None = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, not {self.gate!r}")


def param(default, help: str, *, unit: str = "", gate: str | None = None, lo: float | None = None,
          hi: float | None = None, choices: tuple[str, ...] | None = None) -> dataclasses.Field:
    """A ``Params`` field: its default and its :class:`Spec`."""
    spec = Spec(help, unit, gate, lo, hi, tuple(choices) if choices else None)
    return dataclasses.field(default=default, metadata={META_KEY: spec})


def spec_of(field: dataclasses.Field) -> Spec:
    try:
        return field.metadata[META_KEY]
    except KeyError:
        raise TypeError(f"parameter {field.name!r} is not declared with detectors.params.param()") from None


def kind_of(field: dataclasses.Field) -> str:
    """bool, int, float, str, duration or int_set: what the default (and the unit) say it is."""
    default = field.default
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "duration" if spec_of(field).unit == "ns" else "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "str"
    if isinstance(default, frozenset):
        return "int_set"
    raise TypeError(f"parameter {field.name!r}: unsupported default {default!r}")


# -- parsing -----------------------------------------------------------------------------------------

DURATION_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
                     "min": 60_000_000_000, "h": 3_600_000_000_000}
_DURATION = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([a-zµ]*)\s*$")


def parse_duration_ns(raw) -> int:
    """``1s``, ``250ms``, ``20us``/``20µs``, ``1.5min``, ``100ns`` or a bare number of ns -> int ns."""
    if isinstance(raw, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(raw, (int, float)):
        value, unit = float(raw), "ns"
    else:
        m = _DURATION.match(str(raw))
        if not m:
            raise ValueError("a duration such as 250ms, 1s, 20us or a number of ns")
        value, unit = float(m.group(1).replace("_", "")), (m.group(2) or "ns")
        if unit not in DURATION_UNITS_NS:
            raise ValueError(f"unknown unit {unit!r} (use {', '.join(DURATION_UNITS_NS)})")
    ns = value * DURATION_UNITS_NS[unit]
    if not math.isfinite(ns) or ns != round(ns):
        raise ValueError("a whole number of nanoseconds")
    return int(round(ns))


def _parse_int(raw) -> int:
    if isinstance(raw, bool):
        raise ValueError("an integer, not a boolean")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        if raw.is_integer():
            return int(raw)
        raise ValueError("an integer")
    text = str(raw).strip().replace("_", "")
    try:
        return int(text)
    except ValueError:
        pass
    value = float(text)  # 1e6 is fine, 2.5 is not
    if not value.is_integer():
        raise ValueError("an integer")
    return int(value)


def _parse_float(raw) -> float:
    if isinstance(raw, bool):
        raise ValueError("a number, not a boolean")
    value = float(str(raw).strip().replace("_", "")) if isinstance(raw, str) else float(raw)
    if not math.isfinite(value):
        raise ValueError("a finite number")
    return value


def _parse_bool(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError("true or false")


def _parse_int_set(raw) -> frozenset:
    items = raw if isinstance(raw, (list, tuple, set, frozenset)) else [
        x for x in str(raw).replace(";", ",").split(",") if x.strip()]
    return frozenset(_parse_int(x) for x in items)


_PARSERS = {"bool": _parse_bool, "int": _parse_int, "float": _parse_float, "duration": parse_duration_ns,
            "str": lambda raw: str(raw).strip(), "int_set": _parse_int_set}
KIND_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number",
              "duration": "a duration (250ms, 1s, 20us, or ns)", "str": "a word", "int_set": "a list of integers"}


def coerce(field: dataclasses.Field, raw, owner: str):
    """``raw`` (a --set string or a TOML value) as the parameter's kind, range-checked."""
    spec, kind = spec_of(field), kind_of(field)
    where = f"{owner}.{field.name}"
    try:
        value = _PARSERS[kind](raw)
    except (TypeError, ValueError) as exc:
        detail = f": {exc}" if kind == "duration" and "unit" in str(exc) else ""
        raise ParameterError(f"{where}: {raw!r} is not {KIND_WORDS[kind]}{detail}") from None
    if spec.choices and value not in spec.choices:
        raise ParameterError(f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
    values = value if kind == "int_set" else [value] if kind != "str" and kind != "bool" else []
    for v in values:
        if spec.lo is not None and v < spec.lo:
            raise ParameterError(f"{where}: {raw!r} is below the smallest allowed value, "
                                 f"{_format_bound(field, spec.lo)}")
        if spec.hi is not None and v > spec.hi:
            raise ParameterError(f"{where}: {raw!r} is above the largest allowed value, "
                                 f"{_format_bound(field, spec.hi)}")
    return value


def format_value(field: dataclasses.Field, value) -> str:
    """A value as a user would type it (durations with a unit)."""
    kind = kind_of(field)
    if kind == "duration":
        return format_duration_ns(value)
    if kind == "int_set":
        return ",".join(str(v) for v in sorted(value))
    if kind == "bool":
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_duration_ns(ns: float) -> str:
    """The largest unit that shows ``ns`` exactly: 1s, 250ms, 20us, 7ns."""
    ns = int(ns)
    for unit, size in (("h", 3_600_000_000_000), ("min", 60_000_000_000), ("s", 1_000_000_000),
                       ("ms", 1_000_000), ("us", 1_000)):
        if ns and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


# -- a detector's parameters -----------------------------------------------------------------------

def parse_assignment(text: str, what: str = "--set") -> tuple[str, str]:
    """``herd.min_clients=50`` -> ("herd.min_clients", "50"); anything else raises ParameterError."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    owner, dot, name = key.partition(".")
    if not sep or not dot or not owner or not name or not value:
        raise ParameterError(f"{what} {text.strip()!r}: expected DETECTOR.PARAMETER=VALUE "
                             f"(e.g. herd.window_ns=250ms)")
    return key, value


def fields_of(params_cls) -> list[dataclasses.Field]:
    return list(dataclasses.fields(params_cls))


def make_params(module, overrides: dict[str, object]):
    """The module's Params with ``overrides`` ({"herd.min_clients": 50}) applied and checked;
    entries for other detectors are ignored, unknown names and bad values raise ParameterError."""
    fields = {f.name: f for f in fields_of(module.Params)}
    changes = {}
    for key, raw in overrides.items():
        owner, _, name = key.partition(".")
        if owner != module.NAME:
            continue
        if name not in fields:
            raise ParameterError(f"{key}: {module.NAME} has no parameter {name!r} "
                                 f"(known: {', '.join(sorted(fields))}; `herdscope detectors` lists them)")
        changes[name] = coerce(fields[name], raw, owner)
    return dataclasses.replace(module.Params(), **changes)


def _format_bound(field: dataclasses.Field, bound: float | None) -> str | None:
    """A range end as typed (for a set: the bound of each element)."""
    if bound is None:
        return None
    return f"{bound:g}" if kind_of(field) == "int_set" else format_value(field, bound)


def describe_params(params_cls) -> list[dict]:
    """One dict per parameter: name, kind, default (as typed), unit, gate, lo, hi, choices, help."""
    rows = []
    for f in fields_of(params_cls):
        spec = spec_of(f)
        rows.append({
            "name": f.name, "kind": kind_of(f), "default": format_value(f, f.default),
            "unit": spec.unit, "gate": spec.gate,
            "lo": _format_bound(f, spec.lo), "hi": _format_bound(f, spec.hi),
            "choices": list(spec.choices) if spec.choices else None, "help": spec.help,
        })
    return rows


def check_declared(params_cls) -> None:
    """Raise TypeError unless every field is declared with :func:`param` and its default is valid."""
    for f in fields_of(params_cls):
        kind_of(f)
        coerce(f, f.default, params_cls.__qualname__)


def to_jsonable(params) -> dict:
    """The parameters as JSON values (sets as sorted lists)."""
    out = {}
    for f in fields_of(type(params)):
        value = getattr(params, f.name)
        out[f.name] = sorted(value) if isinstance(value, frozenset) else value
    return out
