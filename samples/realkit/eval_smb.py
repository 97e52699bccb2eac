"""Evaluation SMB2 scenario (samples/make_eval.py): an oplock-break queue with another client
count and timing than samples/realkit/scen_smb.py's (12 waiters 100 ms apart behind a 1.5 s
break acknowledgment, instead of 4 waiters 300 ms apart behind 3 s).

It runs realkit/scen_smb.py's ``run_queue`` (smbd, smbprotocol clients that read and
acknowledge break notifications themselves) with these parameters; the capture is renamed to
this scenario's file name and the manifest entry is built here.
"""
from __future__ import annotations

from pathlib import Path

from . import facts, scen_smb
from .core import ADDED_DETECTORS, Lab
from .eval_common import capture_name, healthy_twin, new_entry, pathological

WAITERS, ACK_DELAY, SPACING = 12, 1.5, 0.1


def build_queue12(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "smb2-break-queue-12"
    fname = capture_name(scen, healthy)
    r = scen_smb.run_queue(lab, out, healthy, waiters=WAITERS, ack_delay=ACK_DELAY,
                           spacing=SPACING)
    (out / r["fname"]).rename(out / fname)
    t0, ws = r["t_first"], r["waiters"]
    waits = [round((w["t_done"] - w["t_send"]) * 1000, 1) for w in ws]
    made = scen_smb.made_text(
        f"Client A (10.77.4.1) holds a batch oplock on {r['path']}; {len(ws)} other clients "
        f"(10.77.4.2-{len(ws) + 1}) open it for reading {r['spacing'] * 1000:.0f} ms apart; "
        + ("A acknowledges the break at once." if healthy else
           f"A acknowledges the break after {r['ack_delay']:.1f} s."))
    measured = dict(waiters=len(ws), breaks=len(r["breaks"]), ack_delay_s=r["ack_delay"],
                    waiter_create_ms=waits,
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = new_entry(scen, healthy, made, measured=measured)
    if healthy:
        return healthy_twin(entry, (
            f"The same {len(ws)} opens; A acknowledges the break at once, so every CREATE "
            f"completes within {max(waits):.0f} ms. No queue."))
    br = r["breaks"][0]
    queued = [w for w, ms in zip(ws, waits) if ms > 100]
    return pathological(entry, (
        f"The first opener makes smbd break A's batch oplock; A sits on the break for "
        f"{br['t_ack'] - br['t_break']:.2f} s; {len(queued)} of the {len(ws)} CREATEs wait "
        f"behind that one break (longest {max(waits):.0f} ms) and complete right after A's "
        "acknowledgment."),
        silent=["herd", "retry_storm", "tcp_stall", "toctou", "conn_churn", *ADDED_DETECTORS], expect=[dict(
        detector="smb_break_queue", kind="slow_ack", min_severity="medium",
        start_s=round(br["t_break"] - t0, 3), tolerance_s=0.3, client="", server=scen_smb.SMBD,
        resource=scen_smb.share_resource(r["path"]), count=1, count_tolerance=0,
        measured=dict(holder=r["holder"]["client"], waiters=len(queued),
                      waiter_clients=[w["client"] for w in queued],
                      break_to_ack_ms=round((br["t_ack"] - br["t_break"]) * 1000, 1),
                      max_wait_ms=max(waits), ack_s=round(br["t_ack"] - t0, 3)))])


def tshark_facts(entry: dict, path) -> dict:
    """What tshark sees (the same facts as samples/MANIFEST.toml's smb2-break-queue)."""
    return facts.smb2_breaks(path)
