"""The RNR loop's proof: the PSN ladder of the finding's queue pairs (dashboards/charts/psn_ladder.py)
with the RNR NAKs and the requests sent again after each wait marked as the detector pairs them
(``detectors.rnr_retry.nak_retries``, and the go-back run each RNR NAK started)."""
from __future__ import annotations

import polars as pl

import detectors.rnr_retry as detector
from detectors import rocev2_common as rc

from ..charts.psn_ladder import finding_flows, ladder_points, ladder_view
from .base import Proof, proof_chart
from .ladder import ladder_proof


def rnr_points(packets: pl.DataFrame, finding: dict, window: tuple[int, int], extent: tuple[int, int],
               view: tuple[int, int] | None, params: detector.Params) -> dict:
    """The ladder's points of the finding's QP directions, the RNR retries (and the run each resent)
    marked; ``view``, ``note`` (the zoom) and ``flows``."""
    rows = rc.rc_packets(packets)
    req, rsp = rc.requests(rows), rc.responses(rows)
    flows = finding_flows(req, rsp, finding.get("evidence_frames") or [])
    opening, (lo, hi), note = ladder_view(window, extent, view)
    retried = None
    if flows.height:
        naks = detector.nak_retries(req, rsp, params.retry_window_ns)
        parts = [naks.select(pl.col("retry_frame").alias("frame")).drop_nulls()] if naks.height else []
        ep = rc.episodes(req, rsp, 0)
        if ep.height:
            parts.append(ep.filter(pl.col("rnr_frame").is_not_null()).select(pl.col("frames").alias("frame"))
                         .explode("frame"))
        retried = pl.concat(parts) if parts else None
    pts = ladder_points(req, rsp, flows, lo, hi, retried=retried) if flows.height else pl.DataFrame()
    return {"points": pts, "view": opening, "note": note, "flows": flows}


@proof_chart(detector.NAME)
def rnr_retry_proof(p: Proof) -> list[tuple[object, str]]:
    return ladder_proof(p, detector, rnr_points, "RNR NAK loop",
                        "Each request's PSN over time (relative to the QP's first); RNR NAKs as purple triangles, "
                        "the requests sent again after each RNR wait in violet; the flat steps are the timer's "
                        "delay. The finding's window shaded (scroll to zoom, drag to pan).")
