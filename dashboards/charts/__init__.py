"""Pure chart builders shared by the pages: a Polars frame in, an Altair chart out (no capture, no
Streamlit). Each detector's proof chart lives beside its evidence in :mod:`dashboards.proofs`.

See :mod:`dashboards.charts.base` for the row budget and how a chart says it was sampled.
"""
from .base import MAX_ROWS, chart_notes, empty, finish, nice_bin_ns, thin
from .generic import evidence_timeline
from .incidents import incident_lanes
from .overview import PICK, findings_timeline
from .transactions import latency_histogram, latency_over_time

__all__ = [
    "MAX_ROWS", "PICK", "chart_notes", "empty", "evidence_timeline", "findings_timeline", "finish", "incident_lanes",
    "latency_histogram", "latency_over_time", "nice_bin_ns", "thin",
]
