"""What the capture's DNS answers say a name resolves to: the A/AAAA addresses (RFC 1035 §3.4.1, RFC
3596 §2.2) in the answer section (§4.1.3) of a response, for the incident linker's dependency rule
(a herd on ``kdc.corp.example`` whose answers name 10.77.0.88 is a dependency of a storm at 10.77.0.88).

The DNS decoder (``analyzer/decoders/dns.py``) reads no RDATA, so :func:`answer_addresses` walks the
few responses the linker asks about (one or two per DNS name a finding is about, never one per
packet), skipping names with the decoder's own kernel (``dns_kernels.skip_name``, loop-safe: it never
follows a pointer). Every answer RR counts, whatever its owner name: a CNAME chain's target
addresses are the answer to the question. UDP messages only (a TCP response starts with its record
length and may span segments: such names have no answers here).
"""
from __future__ import annotations

import ipaddress

import numpy as np

from analyzer.decoders.dns_kernels import skip_name

HEADER_BYTES = 12  # RFC 1035 §4.1.1
QUESTION_TAIL_BYTES = 4  # QTYPE, QCLASS after the QNAME (§4.1.2)
RR_FIXED_BYTES = 10  # TYPE, CLASS, TTL, RDLENGTH after the owner name (§4.1.3)
TYPE_A, TYPE_AAAA = 1, 28
ADDRESS_BYTES = {TYPE_A: 4, TYPE_AAAA: 16}


def answer_addresses(message: bytes) -> list[str]:
    """The A and AAAA addresses of one DNS message's answer section, in order (IPv6 in RFC 5952 form,
    as the frames write it); [] for a message that is cut short or malformed where it matters."""
    buf = np.frombuffer(message, dtype=np.uint8)
    end = len(buf)
    if end < HEADER_BYTES:
        return []
    qdcount = int.from_bytes(message[4:6], "big")
    ancount = int.from_bytes(message[6:8], "big")
    pos = HEADER_BYTES
    for _ in range(qdcount):
        pos = int(skip_name(buf, pos, end))
        if pos < 0:
            return []
        pos += QUESTION_TAIL_BYTES
    out = []
    for _ in range(ancount):
        pos = int(skip_name(buf, pos, end)) if pos < end else -1
        if pos < 0 or pos + RR_FIXED_BYTES > end:
            break
        rtype = int.from_bytes(message[pos:pos + 2], "big")
        rdlength = int.from_bytes(message[pos + 8:pos + 10], "big")
        rdata = pos + RR_FIXED_BYTES
        if rdata + rdlength > end:
            break
        if ADDRESS_BYTES.get(rtype) == rdlength:
            out.append(str(ipaddress.ip_address(message[rdata:rdata + rdlength])))
        pos = rdata + rdlength
    return out
