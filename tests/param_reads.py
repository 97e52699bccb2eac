"""Which parameters a detector actually reads on a capture, for the monotonic-gate tests
(tests/test_params_monotonic.py, tests/test_params_monotonic_eval.py).

Why it is enough to vary a parameter only on the captures where it is read: a detector is a
deterministic function of the capture and its ``Params`` (a frozen dataclass it reads by attribute).
If a run with the defaults never reads field ``f`` on capture ``C``, a run with any other value of
``f`` takes exactly the same steps up to its end (every step before a first read of ``f`` is the same
as in the default run, and that run has no such read), so it returns the same findings: on ``C`` no
value of ``f`` can add, remove or re-rate a finding, and the monotonic promise holds there trivially.
Most gates are read on a few captures only (the severity steps of tcp_stall are read where a stall
was found, the waiter thresholds of smb_break_queue where a break was slow), so each value runs only
there. ``test_params_monotonic.test_an_unread_parameter_changes_nothing`` re-checks the claim.

The recording is conservative: reading ``__dict__`` or pickling/copying the whole object
(``__getstate__``, ``__reduce__``, ``__reduce_ex__``) counts as reading every field; so do the
dataclass-generated ``__eq__``, ``__hash__``, ``__repr__`` and ``dataclasses.replace``/``asdict``,
because they read each field by attribute. A copy made with ``dataclasses.replace`` records into the
same set (the set belongs to the recording class, not to one instance).
"""
from __future__ import annotations

import contextlib
import dataclasses

import polars as pl

_WHOLE_OBJECT = frozenset({"__dict__", "__getstate__", "__reduce__", "__reduce_ex__"})


def recording(params_cls: type) -> type:
    """A subclass of a detector's Params whose instances add every field name read to ``cls.reads``."""
    names = frozenset(f.name for f in dataclasses.fields(params_cls))

    class Recording(params_cls):
        reads: set = set()

        def __getattribute__(self, attr):
            if attr in names:
                Recording.reads.add(attr)
            elif attr in _WHOLE_OBJECT:
                Recording.reads.update(names)
            return super().__getattribute__(attr)

    Recording.__name__ = Recording.__qualname__ = params_cls.__name__
    Recording.reads = set()
    return Recording


def as_recording(params) -> object:
    """A recording copy of a Params instance (same values); its class's ``reads`` starts empty."""
    cls = recording(type(params))
    copy = cls(**{f.name: getattr(params, f.name) for f in dataclasses.fields(params)})
    cls.reads = set()  # what construction read (a __post_init__ check) is not the detector's reading
    return copy


def detect_reading(module, capture, params=None) -> tuple[pl.DataFrame, frozenset[str]]:
    """``module.detect(capture, params)`` (the defaults when None) and the fields it read."""
    p = as_recording(params if params is not None else module.Params())
    found = module.detect(capture, p)
    return found, frozenset(type(p).reads)


@contextlib.contextmanager
def recording_runs():
    """While active, ``detectors.run`` hands every detector (and the population step, which reads the
    detectors' severity steps) recording Params; yields ``{detector: fields read}``, filled as runs go."""
    import detectors

    reads: dict[str, set[str]] = {}
    original = detectors.configure

    def configure(only=None, overrides=None):
        out = {}
        for name, params in original(only, overrides).items():
            p = as_recording(params)
            reads.setdefault(name, set())
            type(p).reads = reads[name]
            out[name] = p
        return out

    detectors.configure = configure
    try:
        yield reads
    finally:
        detectors.configure = original
