"""The go-back-N proof: the PSN ladder of the finding's queue pairs (dashboards/charts/psn_ladder.py),
the resends marked as the detector reads them (``detectors.gbn_retransmission.classify``: go-back-N
episodes triggered by a NAK or the ACK timer; RNR-driven ones are rnr_retry's and stay "sent")."""
from __future__ import annotations

import polars as pl

import detectors.gbn_retransmission as detector
from detectors import rocev2_common as rc

from ..charts.base import empty
from ..charts.psn_ladder import finding_flows, ladder_points, ladder_view, psn_ladder
from .base import Proof, detector_params, proof_chart


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
    if not p.has("rocev2_packets"):
        return [(empty("This capture has no RoCEv2 packets (rocev2_packets)."), "")]
    cut = gbn_points(p.cap.frame("rocev2_packets"), p.finding, p.window, (p.t0, p.t1), p.view,
                     detector_params(p.finding, detector))
    if cut["flows"].height == 0:
        return [(empty("The finding's evidence frames are not RoCEv2 requests or responses of this capture."), "")]
    trigger = "an ACK timeout" if p.finding.get("kind") == "timeout" else "NAKs"
    chart = psn_ladder(cut["points"], t0_ns=p.t0, window_ns=p.window, view_ns=cut["view"],
                       title=f"PSN ladder of {p.finding.get('resource') or 'the queue pair'}: go-back-N after {trigger}",
                       focus=cut["flows"]["label"].to_list(), notes=[cut["note"]])
    return [(chart, "Each request's PSN over time (relative to the QP's first), resends of the go-back-N "
                    "episodes in orange, the responder's ACKs, NAKs and RNR NAKs below them in PSN order; "
                    "the finding's window shaded (scroll to zoom, drag to pan).")]
