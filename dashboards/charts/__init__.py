"""Pure chart builders: a Polars frame in, an Altair chart out (no capture, no Streamlit).

See :mod:`dashboards.charts.base` for the row budget and how a chart says it was sampled.
"""
from .base import MAX_ROWS, chart_notes, empty, finish, nice_bin_ns, thin
from .overview import PICK, findings_timeline
from .herd import herd_chart
from .proofs import (amplification_chart, break_queue_chart, churn_rate_chart, classify_backoff,
                     lifetime_chart, retry_intervals, retry_ladder, stevens_chart, toctou_chart)
from .transactions import latency_histogram, latency_over_time

__all__ = [
    "MAX_ROWS", "PICK", "amplification_chart", "break_queue_chart", "chart_notes", "churn_rate_chart",
    "classify_backoff", "empty", "findings_timeline", "finish", "herd_chart", "latency_histogram",
    "latency_over_time", "lifetime_chart", "nice_bin_ns", "retry_intervals", "retry_ladder", "stevens_chart",
    "thin", "toctou_chart",
]
