"""Scripted TCP conversations (steps for tests/builders.py's tcp_conversation) that two test
modules check: tests/test_tcp_analysis.py against the expected analysis, tests/test_tcp_conformance.py
against tshark."""
from __future__ import annotations

from builders import (SERVER, ack_step as ack, data_step as data, handshake, merged_pcaps, opt_sack, opt_sack_perm,
                      tcp_conversation)

US = 1_000  # ns


N2 = b"\x01\x01"  # two NOPs before a SACK option


def sack_bif_steps():
    """Client data (ISN 5000) against server ACKs with SACK options; frames 8, 10, 12, 15 carry the
    bytes in flight under test (checked against tshark in tests/test_tcp_conformance.py)."""
    return handshake(client_opts=opt_sack_perm(), server_opts=opt_sack_perm()) + [
        data(100 * US, True, seq=1), data(101 * US, True, seq=101), data(102 * US, True, seq=201),
        ack(150 * US, False, ack=1, options=N2 + opt_sack((5101, 5201))),                 # 7
        data(160 * US, True, seq=301),                                                  # 8
        ack(170 * US, False, ack=1, options=N2 + opt_sack((5101, 5201), (5301, 5401))),   # 9
        data(180 * US, True, seq=401),                                                  # 10
        ack(190 * US, False, ack=1),                                                    # 11: no SACK
        data(200 * US, True, seq=501), data(201 * US, True, seq=601),                   # 12, 13
        ack(210 * US, False, ack=1,                                                     # 14: 4 blocks
            options=N2 + opt_sack((5101, 5201), (5301, 5401), (5501, 5601), (5651, 5701))),
        data(220 * US, True, seq=701),                                                  # 15
    ]


STALE = 2**32 - 500_000_000  # relative sequence number of the server's stale ACK (its ISN is ahead)


def stale_ack_rst_steps():
    """A SYN answered by a bare ACK of an older connection, the client's RST carrying that ACK's
    number, the SYN resent with the same ISN 3 s later and a normal connection after it (the pattern of
    suricata-verify/tls/tls-subjectaltname, checked against tshark in tests/test_tcp_conformance.py)."""
    s = 10**9
    return [
        {"t": 0, "from_client": True, "flags": 0x02, "seq": 0},
        ack(20 * US, False, seq=STALE, ack=976_000_000),                          # 2: stale ACK
        {"t": 21 * US, "from_client": True, "flags": 0x04, "seq": 976_000_000},   # 3: RST
        {"t": 3 * s, "from_client": True, "flags": 0x02, "seq": 0},               # 4: SYN resent
        {"t": 3 * s + 20 * US, "from_client": False, "flags": 0x12, "seq": 0, "ack": 1},
        ack(3 * s + 40 * US, True, seq=1, ack=1),
        data(3 * s + 50 * US, True, seq=1, ack=1),                                # 7
        ack(3 * s + 70 * US, False, seq=1, ack=101),
        data(3 * s + 80 * US, False, b"y" * 200, seq=1, ack=101),
        ack(3 * s + 100 * US, True, seq=101, ack=201),
        {"t": 3 * s + 110 * US, "from_client": True, "flags": 0x11, "seq": 101, "ack": 201},  # 11: FIN
    ]


def fin_close(t, rtt):
    """The client's FIN at ``t``, the server's FIN half an RTT later and the client's last ACK."""
    return [{"t": t, "from_client": True, "flags": 0x11}, {"t": t + rtt // 2, "from_client": False, "flags": 0x11},
            ack(t + rtt, True)]


def gap_capture(resume_with_retransmission: bool, silence=60 * 10**9, rtt=400 * US, b_server=None) -> bytes:
    """Two connections (to the same server, or B's to ``b_server``, an (address, port)): A sends data
    at 10 ms whose ACK is lost, then the whole capture is silent for ``silence``; after it B resumes
    first with new data (or A's retransmission comes first), and both close."""
    ms = 1_000_000
    t = 10 * ms
    a = handshake(0, rtt=rtt) + [data(t, True)]
    b = handshake(1 * ms, rtt=rtt) + [data(2 * ms, True, b"x" * 10), ack(2 * ms + rtt, False)]
    back = t + silence
    first, second = (back, back + 5 * ms) if resume_with_retransmission else (back + 5 * ms, back)
    a += [data(first, True, seq=1), ack(first + rtt, False, ack=101)] + fin_close(first + 2 * rtt, rtt)
    b += [data(second, True, b"x" * 10, seq=11), ack(second + rtt, False)] + fin_close(second + 2 * rtt, rtt)
    return merged_pcaps(tcp_conversation(a), tcp_conversation(b, client=("10.0.0.3", 40001), server=b_server or SERVER))
