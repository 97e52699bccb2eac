"""The proof-chart registry, and what every detector's proof module shares.

A detector's proof lives in ``dashboards/proofs/<detector>.py``: the evidence it cuts from the capture
(pure Polars) and its chart builders (pure Altair), tied together by one function registered with
:func:`proof_chart`::

    @proof_chart("herd")
    def herd_proof(p: Proof) -> list[tuple[object, str]]:
        ...
        return [(chart, "caption")]

:func:`discover` imports every module of the package (no hand-written list), so adding a detector's
chart is adding its module. :func:`proof_charts` is the Findings page's entry point; a detector with
no registered chart gets :func:`generic_proof` (its evidence frames on the time axis), not an error.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass
from typing import Callable

import polars as pl

from detectors.params import ParameterError, fields_of, make_params

from ..charts.base import data_range, empty, focus_domain
from ..charts.generic import evidence_timeline
from ..frames import all_transactions, common_transactions, packet_rows, time_origin, transactions_frame_of

PACKAGE = __name__.rpartition(".")[0]
SHARED_MODULES = frozenset({"base", "ladder"})  # modules of the package that are not a detector's proof

ProofFunction = Callable[["Proof"], list[tuple[object, str]]]
_REGISTRY: dict[str, ProofFunction] = {}


def proof_chart(detector: str) -> Callable[[ProofFunction], ProofFunction]:
    """Register the decorated function as the proof of ``detector`` (its NAME). Registering a second
    function for one detector is a ValueError (two modules claiming one detector is a mistake)."""
    def register(fn: ProofFunction) -> ProofFunction:
        known = _REGISTRY.get(detector)
        if known is not None and known is not fn and _qualified(known) != _qualified(fn):
            raise ValueError(f"detector {detector!r} already has a proof chart: {_qualified(known)}")
        _REGISTRY[detector] = fn
        return fn
    return register


def unregister(detector: str) -> None:
    """Forget ``detector``'s proof (for tests that register a throwaway one)."""
    _REGISTRY.pop(detector, None)


def _qualified(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def discover() -> dict[str, ProofFunction]:
    """Import every proof module of the package (each registers itself); detector NAME -> proof."""
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_") and info.name not in SHARED_MODULES:
            importlib.import_module(f"{PACKAGE}.{info.name}")
    return dict(_REGISTRY)


def registered() -> dict[str, ProofFunction]:
    """Detector NAME -> proof function, as registered so far (:func:`discover` imports them all)."""
    return dict(_REGISTRY)


# -- what a proof function is given -------------------------------------------------------------------

def finding_window(finding: dict) -> tuple[int, int]:
    """The finding's (start, end) in ns; an open end is its start."""
    s = int(finding["start_ns"])
    return s, max(int(finding["end_ns"] if finding["end_ns"] is not None else s), s)


def parameters_of(finding: dict) -> dict:
    """The finding's parameters (stored as JSON text in the findings frame)."""
    raw = finding.get("parameters")
    if isinstance(raw, dict):
        return raw
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {"parameters": raw}


def detector_params(finding: dict, module):
    """The detector's ``Params`` the finding was found with (its recorded parameters over the
    defaults; the defaults when the record is missing or no longer valid)."""
    names = {f.name for f in fields_of(module.Params)}
    recorded = {f"{module.NAME}.{k}": v for k, v in parameters_of(finding).items() if k in names}
    try:
        return make_params(module, recorded)
    except ParameterError:
        return module.Params()


@dataclass(frozen=True)
class Proof:
    """One finding to prove, in its capture: ``window`` the finding's, ``t0``/``t1`` the capture's first
    and last packet (the time axis), ``view`` the range the charts open on (None: the finding's window
    with context, :func:`dashboards.charts.base.focus_domain`; the whole capture with the page's
    toggle) and ``lo``/``hi`` the range the charts carry data for."""

    cap: object
    finding: dict
    findings: pl.DataFrame | None
    tx: pl.DataFrame | None
    t0: int
    t1: int
    window: tuple[int, int]
    view: tuple[int, int] | None
    lo: int
    hi: int

    @classmethod
    def of(cls, cap, finding: dict, findings: pl.DataFrame | None = None, tx: pl.DataFrame | None = None,
           whole: bool = False) -> "Proof":
        t0, t1 = time_origin(cap)
        window = finding_window(finding)
        lo, hi = (t0, t1) if whole else data_range(focus_domain(window), (t0, t1))
        return cls(cap, finding, findings, tx, t0, t1, window, (t0, t1) if whole else None, lo, hi)

    def has(self, frame: str) -> bool:
        return frame in self.cap.frame_names()

    def transactions(self) -> pl.DataFrame:
        """Every protocol's transactions (the page's, when it passed them)."""
        return self.tx if self.tx is not None else all_transactions(self.cap)[0]

    def protocol_transactions(self, extra: tuple[str, ...] = ()) -> pl.DataFrame:
        """The transactions of the finding's protocol (its ``kind``, when that names a protocol with a
        transactions frame) with the ``extra`` protocol columns it has; else every protocol's."""
        name = transactions_frame_of((self.finding.get("kind") or "").lower())
        if name and self.has(name):
            try:
                full = self.cap.frame(name)
                return common_transactions(full).with_columns(full.select([c for c in extra if c in full.columns]))
            except Exception:  # noqa: BLE001 - fall back to every protocol's transactions
                pass
        return self.transactions()


# -- the Findings page's entry point -----------------------------------------------------------------

def proof_charts(cap, finding: dict, findings: pl.DataFrame | None = None,
                 tx: pl.DataFrame | None = None, whole: bool = False) -> list[tuple[object, str]]:
    """The charts that prove ``finding`` (a findings row as a dict), each with a one-line caption:
    the detector's registered proof, else :func:`generic_proof`. Each opens zoomed on the finding's
    window with context (scroll to zoom out), or on the whole capture with ``whole``. The proofs are
    those registered (the package runs :func:`discover` once, when it is imported)."""
    proof = Proof.of(cap, finding, findings, tx, whole)
    fn = _REGISTRY.get(finding["detector"], generic_proof)
    return fn(proof)


def generic_proof(p: Proof) -> list[tuple[object, str]]:
    """A detector without a proof chart of its own: its evidence frames on the capture's time axis."""
    frames = [int(f) for f in (p.finding.get("evidence_frames") or [])]
    if not frames:
        return [(empty(f"No proof chart for detector {p.finding['detector']!r} and no evidence frames: the "
                       f"explanation is above."), "")]
    rows = packet_rows(p.cap, frames, p.t0)
    chart = evidence_timeline(rows, t0_ns=p.t0, window_ns=p.window, view_ns=p.view,
                              title=f"Evidence of {p.finding['detector']} (no proof chart of its own)")
    return [(chart, "Each evidence frame on the time axis, from its source to its destination; the finding's "
                    "window shaded. The frames are listed below.")]
