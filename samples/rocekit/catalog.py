"""The scenario catalogue: name -> builder ``(seed, scale) -> Built``."""
from __future__ import annotations

from . import congestion as c
from . import scenarios as s

SCENARIOS = {
    "rocev2-healthy": s.healthy,
    "rocev2-gbn-storm": s.gbn_storm, "rocev2-gbn-storm-healthy": s.gbn_storm_healthy,
    "rocev2-ack-timeout": s.ack_timeout, "rocev2-ack-timeout-healthy": s.ack_timeout_healthy,
    "rocev2-rnr-loop": s.rnr_loop, "rocev2-rnr-loop-healthy": s.rnr_loop_healthy,
    "rocev2-pfc-storm": c.pfc_storm, "rocev2-pfc-storm-healthy": c.pfc_storm_healthy,
    "rocev2-incast": c.incast, "rocev2-incast-healthy": c.incast_healthy,
    "rocev2-cnp-ignored": c.cnp_ignored, "rocev2-cnp-ignored-healthy": c.cnp_ignored_healthy,
}
