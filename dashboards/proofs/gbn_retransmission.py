"""The go-back-N proof: the PSN ladder of the finding's queue pairs (dashboards/charts/psn_ladder.py),
the resends marked as the detector reads them (``detectors.gbn_retransmission.classify``: go-back-N
episodes triggered by a NAK or the ACK timer; RNR-driven ones are rnr_retry's and stay "sent")."""
from __future__ import annotations

import polars as pl

import detectors.gbn_retransmission as detector
from detectors import rocev2_common as rc

from ..charts.psn_ladder import finding_flows, ladder_points, ladder_view
from .base import Proof, proof_chart
from .ladder import ladder_proof


def gbn_points(packets: pl.DataFrame, finding: dict, window: tuple[int, int], extent: tuple[int, int],
               view: tuple[int, int] | None, params: detector.Params) -> dict:
    """The ladder's points (psn_ladder.ladder_points) of the finding's QP directions, with the
    detector's go-back-N resends marked; ``view``, ``note`` (the zoom) and ``flows``."""
    rows = rc.rc_packets(packets)
    req, rsp = rc.requests(rows), rc.responses(rows)
    flows = finding_flows(req, rsp, finding.get("evidence_frames") or [])
    opening, (lo, hi), note = ladder_view(window, extent, view)
    resent = None
    if flows.height:
        ep = detector.classify(req, rsp, rc.flow_facts(req, rsp), params)
        if ep.height:
            resent = (ep.filter(pl.col("trigger") != "rnr").select(pl.col("frames").alias("frame"))
                      .explode("frame"))
    pts = ladder_points(req, rsp, flows, lo, hi, resent=resent) if flows.height else pl.DataFrame()
    return {"points": pts, "view": opening, "note": note, "flows": flows}


@proof_chart(detector.NAME)
def gbn_retransmission_proof(p: Proof) -> list[tuple[object, str]]:
    trigger = "an ACK timeout" if p.finding.get("kind") == "timeout" else "NAKs"
    return ladder_proof(p, detector, gbn_points, f"go-back-N after {trigger}",
                        "Each request's PSN over time (relative to the QP's first), resends of the go-back-N "
                        "episodes in orange, the responder's ACKs, NAKs and RNR NAKs below them in PSN order; "
                        "the finding's window shaded (scroll to zoom, drag to pan).")
