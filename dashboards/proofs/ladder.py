"""What the go-back-N and RNR proofs share: the PSN ladder of a finding's queue pairs
(dashboards/charts/psn_ladder.py) from the points their own detector's reading marks. Not a detector's
proof itself (base.SHARED_MODULES)."""
from __future__ import annotations

from typing import Callable

from ..charts.base import empty
from ..charts.psn_ladder import psn_ladder
from .base import Proof, detector_params


def ladder_proof(p: Proof, detector, points: Callable[..., dict], what: str,
                 caption: str) -> list[tuple[object, str]]:
    """``points(packets, finding, window, extent, view, params)`` -> {points, view, note, flows} (the
    proof module's cut of the ladder); ``what`` ends the title ("RNR NAK loop")."""
    if not p.has("rocev2_packets"):
        return [(empty("This capture has no RoCEv2 packets (rocev2_packets)."), "")]
    cut = points(p.cap.frame("rocev2_packets"), p.finding, p.window, (p.t0, p.t1), p.view,
                 detector_params(p.finding, detector))
    if cut["flows"].height == 0:
        return [(empty("The finding's evidence frames are not RoCEv2 requests or responses of this capture."), "")]
    chart = psn_ladder(cut["points"], t0_ns=p.t0, window_ns=p.window, view_ns=cut["view"],
                       title=f"PSN ladder of {p.finding.get('resource') or 'the queue pair'}: {what}",
                       focus=cut["flows"]["label"].to_list(), notes=[cut["note"]])
    return [(chart, caption)]
