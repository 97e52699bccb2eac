"""``info``'s packets per transport and service (analyzer.summary.protocols).

Counted per (protocol, port) before the names are given (issue 13: naming every packet held two text
columns of every one), which must count what naming every packet counts, in a fixed order.
"""
from __future__ import annotations

import polars as pl

from analyzer.summary import TRANSPORTS, protocols, services


def _named_per_packet(packets: pl.DataFrame) -> dict[str, dict[str, int]]:
    """The breakdown the way a reader checks it: each packet named, then counted."""
    known = services()
    out: dict[str, dict[str, int]] = {}
    for proto, sport, dport in packets.select("ip_proto", "sport", "dport").iter_rows():
        if proto is None:
            out.setdefault("non-ip", {"all": 0})["all"] += 1
            continue
        transport = TRANSPORTS.get(proto, f"ip-proto-{proto}")
        if transport in ("tcp", "udp"):
            ports = [p for p in (sport, dport) if p in known]
            service = known[min(ports)] if ports else "other"
        else:
            service = "all"
        out.setdefault(transport, {}).setdefault(service, 0)
        out[transport][service] += 1
    return out


def test_packets_per_service_are_those_of_each_packet_named_in_order_of_count_then_name():
    rows = ([(6, 50000, 445)] * 3 + [(6, 88, 50001)] * 3 + [(6, 389, 88)] * 2 + [(6, 40000, 40001)] * 3
            + [(17, 53, 40000)] * 5 + [(17, 40000, 40001)] + [(1, None, None)] * 2 + [(99, None, None)]
            + [(None, None, None)] * 4)
    packets = pl.DataFrame(rows, schema={"ip_proto": pl.UInt8, "sport": pl.UInt16, "dport": pl.UInt16}, orient="row")
    got = protocols(packets)
    assert got == _named_per_packet(packets)
    # equal counts (kerberos, microsoft-ds and other: 3 each) in the order of their names
    assert list(got["tcp"]) == sorted(got["tcp"], key=lambda s: (-got["tcp"][s], s))
    assert list(got) == ["icmp", "ip-proto-99", "tcp", "udp", "non-ip"]
