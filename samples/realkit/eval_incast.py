"""Evaluation TCP incast scenarios (samples/make_eval.py): the setup of scen_incast.py (one client, N
servers in namespaces on one Linux bridge, tbf on the port towards the client) at other operating
points, and from the client's vantage point.

* ``tcp-incast-8x64k``: 8 servers answering 64 KB each; the twin has fewer servers (2 answering
  256 KB: the same bytes per round, too few answers at once to overflow the queue for long).
* ``tcp-incast-32x16k``: 32 servers answering 16 KB each at 200 Mbit/s; the twin staggers the
  requests 2 ms apart (an answer takes 0.7 ms at the bottleneck).
* ``tcp-incast-client-vantage``: 16 x 24 KB as the real sample, captured on the client's eth0
  (after the bottleneck): a tail lost entirely arrives after the timer as ordinary data, so fewer
  timeouts are visible; the twin staggers the requests 5 ms apart.
"""
from __future__ import annotations

from pathlib import Path

from .core import Lab, log
from .eval_common import capture_name, healthy_twin, new_entry, pathological
from .scen_incast import CLIENT, EVERY_DETECTOR, OTHERS_SILENT, made_with, run_incast, summarise


def _build(lab: Lab, out: Path, healthy: bool, scen: str, sick: dict, twin: dict, sweep: dict | None = None,
           note: str = "") -> dict:
    fname = capture_name(scen, healthy)
    r = run_incast(lab, out, fname, **(twin if healthy else sick))
    m = summarise(r)
    log(f"{fname}: {m}")
    entry = new_entry(scen, healthy, made_with(r), measured=m, **({"sweep": sweep} if sweep else {}))
    if healthy:
        return healthy_twin(entry, (
            f"{m['servers']} servers answering {m['response_bytes'] // 1024} KB each"
            + (f", requests {r['stagger_ms']:g} ms apart" if r["stagger_ms"] else "")
            + f": median round {m['median_round_ms']:.0f} ms ({m['ideal_round_ms']:.0f} ms of bottleneck time), "
              f"{m['rounds_with_slow_flows']} rounds with a flow 150 ms behind the median, "
              f"{m['server_tcp_timeouts']} retransmission timeouts on the servers, tbf dropped {m['tbf_dropped']}."),
            silent=EVERY_DETECTOR if m["server_tcp_timeouts"] == 0 else
            [d for d in EVERY_DETECTOR if d != "tcp_stall"],
            **({"note": note} if note else {}))
    first = m["slow_round_index"][0] if m["slow_round_index"] else 0
    return pathological(entry, (
        f"{m['servers']} answers of {m['response_bytes'] // 1024} KB at once: tbf dropped {m['tbf_dropped']} packets; "
        f"{m['rounds_with_slow_flows']} of {m['rounds']} rounds had flows 150 ms or more behind the median "
        f"({m['slow_flows_per_slow_round']}); the servers counted {m['server_tcp_timeouts']} retransmission timeouts "
        f"(on {m['servers_with_timeouts']} servers) and {m['server_loss_probes']} tail loss probes; median round "
        f"{m['median_round_ms']:.0f} ms against {m['ideal_round_ms']:.0f} ms of bottleneck time."),
        silent=OTHERS_SILENT, below_high=[],
        **({"note": note} if note else {}),
        expect=[dict(detector="incast", kind="incast", min_severity="medium",
                     start_s=max(0.0, m["round_start_s"][first]), tolerance_s=1.0, client=CLIENT, server="",
                     resource="", count=1, count_tolerance=0,
                     measured=dict(rounds_with_timeouts=m["rounds_with_slow_flows"],
                                   server_tcp_timeouts=m["server_tcp_timeouts"], fan_in=m["servers"]))])


def build_8x64k(lab: Lab, out: Path, healthy: bool) -> dict:
    return _build(lab, out, healthy, "tcp-incast-8x64k",
                  sick=dict(n_servers=8, resp_bytes=64 * 1024, rounds=10),
                  twin=dict(n_servers=2, resp_bytes=256 * 1024, rounds=10),
                  sweep={"variable": "servers", "value": 8},
                  note="twin: fewer servers with the same bytes per round")


def build_32x16k(lab: Lab, out: Path, healthy: bool) -> dict:
    return _build(lab, out, healthy, "tcp-incast-32x16k",
                  sick=dict(n_servers=32, resp_bytes=16 * 1024, rounds=8, rate_mbit=200.0),
                  twin=dict(n_servers=32, resp_bytes=16 * 1024, rounds=8, rate_mbit=200.0, stagger_ms=2.0),
                  sweep={"variable": "servers", "value": 32})


def build_client_vantage(lab: Lab, out: Path, healthy: bool) -> dict:
    return _build(lab, out, healthy, "tcp-incast-client-vantage",
                  sick=dict(n_servers=16, resp_bytes=24 * 1024, rounds=12, vantage="client"),
                  twin=dict(n_servers=16, resp_bytes=24 * 1024, rounds=12, vantage="client", stagger_ms=5.0),
                  note="captured at the client, after the bottleneck: tails lost entirely are not visible as "
                       "retransmissions, so the detector counts fewer timed-out flows than the servers did")
