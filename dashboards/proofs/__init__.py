"""Proof charts: one module per detector, each registered for its detector, found by importing this
package (no hand-written list).

``dashboards/proofs/<detector>.py`` holds that detector's evidence selection (pure Polars over the
capture's frames), its chart builders (pure Altair, see :mod:`dashboards.charts.base` for the row
budget and the notes) and one function registered with ``@proof_chart("<detector>")`` that ties them
together. Adding a detector's chart is adding its module; a detector without one gets a generic view
of its evidence frames (:func:`dashboards.proofs.base.generic_proof`). :func:`proof_charts` is the
Findings page's entry point: finding in, list of (chart, caption) out. The findings schema is
``detectors.base.FINDING_COLUMNS``; a finding arrives here as one row (a dict).

What the detectors report is not re-derived here: the charts show the traffic around the finding
(its window, its key, its connection) so a reader can see the pathology the detector measured; where a
chart names a property the detector decides (the backoff class), it asks the detector's function.
"""
from .base import (Proof, detector_params, discover, finding_window, generic_proof, parameters_of, proof_chart,
                   proof_charts, registered, unregister)

discover()

__all__ = ["Proof", "detector_params", "discover", "finding_window", "generic_proof", "parameters_of",
           "proof_chart", "proof_charts", "registered", "unregister"]
