"""Byte-exact builders for capture files, packet headers and protocol messages (BER, Kerberos, DNS),
for fixtures that state every byte.

Only ``struct``: each function is a transcription of its spec's layout, so a fixture reads as the
spec does. Checksums are left zero (herdscope does not validate them, like Wireshark's default).
"""
from __future__ import annotations

import struct

# --- classic pcap ---------------------------------------------------------------------------------


def pcap_file(records, linktype=1, big_endian=False, nanosecond=False, snaplen=262144, kuznetzov=False):
    """records: iterable of (ts_sec, ts_frac, data) or (ts_sec, ts_frac, data, wire_len)."""
    o = ">" if big_endian else "<"
    magic = 0xA1B2CD34 if kuznetzov else (0xA1B23C4D if nanosecond else 0xA1B2C3D4)
    out = bytearray(struct.pack(o + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
    for rec in records:
        sec, frac, data = rec[:3]
        wire = rec[3] if len(rec) > 3 else len(data)
        out += struct.pack(o + "IIII", sec, frac, len(data), wire)
        if kuznetzov:
            out += struct.pack(o + "IHBB", 0, 0, 0, 0)
        out += data
    return bytes(out)


# --- pcapng -----------------------------------------------------------------------------------------


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def option(code: int, value: bytes, o="<") -> bytes:
    return struct.pack(o + "HH", code, len(value)) + _pad4(value)


def block(btype: int, body: bytes, o="<") -> bytes:
    body = _pad4(body)
    total = 12 + len(body)
    return struct.pack(o + "II", btype, total) + body + struct.pack(o + "I", total)


def shb(o="<", options=b"") -> bytes:
    body = struct.pack(o + "IHHq", 0x1A2B3C4D, 1, 0, -1) + options
    return block(0x0A0D0D0A, body, o)


def idb(linktype=1, snaplen=0, tsresol=None, tsoffset=None, name=None, o="<") -> bytes:
    opts = b""
    if name is not None:
        opts += option(2, name.encode(), o)
    if tsresol is not None:
        opts += option(9, bytes([tsresol]), o)
    if tsoffset is not None:
        opts += option(14, struct.pack(o + "q", tsoffset), o)
    if opts:
        opts += struct.pack(o + "HH", 0, 0)
    return block(1, struct.pack(o + "HHI", linktype, 0, snaplen) + opts, o)


def epb(iface: int, ticks: int, data: bytes, wire_len=None, o="<") -> bytes:
    wire = len(data) if wire_len is None else wire_len
    body = struct.pack(o + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(data), wire) + _pad4(data)
    return block(6, body, o)


def spb(data: bytes, wire_len=None, o="<") -> bytes:
    wire = len(data) if wire_len is None else wire_len
    return block(3, struct.pack(o + "I", wire) + _pad4(data), o)


def packet_block(iface: int, ticks: int, data: bytes, o="<") -> bytes:
    """The obsolete Packet Block (type 2)."""
    body = struct.pack(o + "HHIIII", iface, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), len(data))
    return block(2, body + _pad4(data), o)


def custom_block(pen=32473, payload=b"hello", copy=True, o="<") -> bytes:
    return block(0x00000BAD if copy else 0x40000BAD, struct.pack(o + "I", pen) + payload, o)


# --- packet headers -------------------------------------------------------------------------------


def mac(n: int) -> bytes:
    return bytes([2, 0, 0, 0, 0, n])


def ethernet(payload: bytes, ethertype=0x0800, vlans=(), outer_tpid=0x8100) -> bytes:
    """Ethernet II; ``vlans`` outermost first. The outer tag uses ``outer_tpid`` (0x88a8 for QinQ)."""
    types = [outer_tpid] + [0x8100] * (len(vlans) - 1) + [ethertype] if vlans else [ethertype]
    out = mac(1) + mac(2) + struct.pack(">H", types[0])
    for k, vid in enumerate(vlans):
        out += struct.pack(">HH", vid, types[k + 1])
    return out + payload


def ipv4(payload: bytes, proto=6, src="10.0.0.1", dst="10.0.0.2", ident=1, flags_frag=0x4000,
         ttl=64, options=b"", total_len=None) -> bytes:
    ihl = 5 + len(options) // 4
    total = 4 * ihl + len(payload) if total_len is None else total_len
    hdr = struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, 0, total, ident, flags_frag, ttl, proto, 0,
                      bytes(map(int, src.split("."))), bytes(map(int, dst.split("."))))
    return hdr + options + payload


def ipv6(payload: bytes, nh=6, src="2001:db8::1", dst="2001:db8::2", hlim=64, ext=b"", plen=None) -> bytes:
    import ipaddress
    length = len(ext) + len(payload) if plen is None else plen
    return (struct.pack(">IHBB", 0x60000000, length, nh, hlim) + ipaddress.IPv6Address(src).packed
            + ipaddress.IPv6Address(dst).packed + ext + payload)


def ipv6_ext(next_header: int, body: bytes = b"\0" * 6) -> bytes:
    """A generic extension header (hop-by-hop, routing, destination options): 8-byte units."""
    body = body + b"\0" * (-(len(body) + 2) % 8)
    return bytes([next_header, (len(body) + 2) // 8 - 1]) + body


def ipv6_frag(next_header: int, offset=0, more=False, ident=0x12345678) -> bytes:
    return struct.pack(">BBHI", next_header, 0, (offset & 0xFFF8) | int(more), ident)


def tcp(payload=b"", sport=1234, dport=80, seq=1000, ack=0, flags=0x18, window=65535, options=b"") -> bytes:
    options = options + b"\x01" * (-len(options) % 4)
    doff = (20 + len(options)) // 4
    return struct.pack(">HHIIBBHHH", sport, dport, seq, ack, doff << 4 | (flags >> 8 & 0x0F), flags & 0xFF,
                       window, 0, 0) + options + payload


def udp(payload=b"", sport=5353, dport=53, length=None) -> bytes:
    return struct.pack(">HHHH", sport, dport, 8 + len(payload) if length is None else length, 0) + payload


def icmp(icmp_type: int, code: int, rest=b"\0\0\0\0", payload=b"") -> bytes:
    return struct.pack(">BBH", icmp_type, code, 0) + rest + payload


# TCP options
def opt_mss(v):
    return struct.pack(">BBH", 2, 4, v)


def opt_wscale(v):
    return struct.pack(">BBB", 3, 3, v)


def opt_sack_perm():
    return b"\x04\x02"


def opt_sack(*blocks):
    return struct.pack(">BB", 5, 2 + 8 * len(blocks)) + b"".join(struct.pack(">II", a, b) for a, b in blocks)


def opt_ts(val, ecr):
    return struct.pack(">BBII", 8, 10, val, ecr)


# --- TCP conversations ----------------------------------------------------------------------------

CLIENT = ("10.0.0.1", 40000)
SERVER = ("10.0.0.2", 445)


def tcp_conversation(steps, client=CLIENT, server=SERVER, client_isn=1000, server_isn=5000, nanosecond=True):
    """A pcap (Ethernet, ns) from a script of steps. Each step is a dict:
    ``t`` (ns), ``from_client`` (bool), ``flags`` (int, default ACK), ``seq``/``ack`` (relative to each
    side's ISN; defaults: the sender's next sequence number / the last byte received), ``data`` (bytes),
    ``window`` (default 65535), ``options`` (bytes), ``caplen`` (cut the record to this many bytes).
    """
    nxt = {True: 0, False: 0}  # relative next seq per side (0 = the SYN)
    got = {True: 0, False: 0}  # relative bytes received per side (what an ACK would say)
    records = []
    for st in steps:
        fc = st["from_client"]
        flags = st.get("flags", 0x10)
        data = st.get("data", b"")
        seq_rel = st.get("seq", nxt[fc])
        ack_rel = st.get("ack", got[fc])
        isn, peer_isn = (client_isn, server_isn) if fc else (server_isn, client_isn)
        (sa, sp), (da, dp) = (client, server) if fc else (server, client)
        seg = tcp(data, sport=sp, dport=dp, seq=(isn + seq_rel) & 0xFFFFFFFF,
                  ack=(peer_isn + ack_rel) & 0xFFFFFFFF if flags & 0x10 else 0, flags=flags,
                  window=st.get("window", 65535), options=st.get("options", b""))
        frame = ethernet(ipv4(seg, src=sa, dst=da))
        t = st["t"]
        rec = (t // 10**9, t % 10**9, frame[:st["caplen"]] if "caplen" in st else frame, len(frame))
        records.append(rec)
        end = seq_rel + len(data) + (1 if flags & 0x03 else 0)
        nxt[fc] = max(nxt[fc], end)
        got[not fc] = max(got[not fc], end)
    return pcap_file(records, nanosecond=nanosecond)


def handshake(t0=0, rtt=20_000, client_opts=b"", server_opts=b""):
    """SYN, SYN/ACK, ACK steps starting at t0 with the given RTT (ns) split in halves."""
    return [
        {"t": t0, "from_client": True, "flags": 0x02, "options": client_opts},
        {"t": t0 + rtt // 2, "from_client": False, "flags": 0x12, "options": server_opts},
        {"t": t0 + rtt, "from_client": True, "flags": 0x10},
    ]



def data_step(t, from_client, payload=b"x" * 100, **kw):
    """A tcp_conversation step: ``payload`` with PSH/ACK at ``t`` (ns)."""
    return {"t": t, "from_client": from_client, "data": payload, "flags": 0x18, **kw}


def ack_step(t, from_client, **kw):
    """A tcp_conversation step: a bare ACK at ``t`` (ns)."""
    return {"t": t, "from_client": from_client, "flags": 0x10, **kw}


def stream_steps(stream: bytes, cuts=(), skip=(), server=False, t0=100_000, gap=10_000):
    """tcp_conversation steps sending ``stream`` (client to server unless ``server``) as PSH/ACK segments
    cut at the offsets ``cuts`` (those outside the stream are ignored), one every ``gap`` ns from ``t0``;
    the pieces whose index is in ``skip`` are never sent (a capture gap: their time slot stays empty)."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(stream))), len(stream)]
    steps, t = [], t0
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        if k not in skip:
            steps.append({"t": t, "from_client": not server, "data": stream[a:b], "seq": 1 + a, "flags": 0x18})
        t += gap
    return steps


def merged_pcaps(*captures: bytes) -> bytes:
    """One pcap holding the records of several (little-endian, the same link type and time unit: the
    first one's header), in time order; records at the same time in the order given."""
    header, records = captures[0][:24], []
    for data in captures:
        pos = 24
        while pos + 16 <= len(data):
            sec, frac, incl, _ = struct.unpack_from("<IIII", data, pos)
            records.append((sec, frac, len(records), data[pos:pos + 16 + incl]))
            pos += 16 + incl
    return header + b"".join(r[3] for r in sorted(records))


# --- BER / DER (X.690) ----------------------------------------------------------------------------

def length_octets(n: int) -> bytes:
    """X.690 §8.1.3 definite length, minimal form."""
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def tlv(tag: int | bytes, *parts: bytes) -> bytes:
    """One TLV: ``tag`` is an identifier octet (0x30) or the identifier bytes; parts are joined."""
    ident = bytes([tag]) if isinstance(tag, int) else tag
    content = b"".join(parts)
    return ident + length_octets(len(content)) + content


def integer(v: int, tag: int = 0x02) -> bytes:
    n = max(1, (v.bit_length() + 8) // 8)
    return tlv(tag, v.to_bytes(n, "big", signed=True))


def octets(b: bytes | str, tag: int = 0x04) -> bytes:
    return tlv(tag, b.encode() if isinstance(b, str) else b)


def seq(*parts: bytes) -> bytes:
    return tlv(0x30, *parts)


def ctx(n: int, *parts: bytes, constructed: bool = True) -> bytes:
    return tlv((0xA0 if constructed else 0x80) | n, *parts)


# --- Kerberos messages (RFC 4120 §5, DER) ---------------------------------------------------------

def kstr(s: str | bytes) -> bytes:
    return octets(s, tag=0x1B)  # KerberosString ::= GeneralString


def principal(name_type: int, *parts: str | bytes) -> bytes:
    return seq(ctx(0, integer(name_type)), ctx(1, seq(*[kstr(p) for p in parts])))


def ktime(t: str) -> bytes:
    return octets(t, tag=0x18)


def enc_data(etype: int, kvno: int | None = None, cipher: bytes = b"\x01\x02\x03") -> bytes:
    return seq(ctx(0, integer(etype)), *([ctx(1, integer(kvno))] if kvno is not None else []),
               ctx(2, octets(cipher)))


def pa(ptype: int, value: bytes = b"") -> bytes:
    return seq(ctx(1, integer(ptype)), ctx(2, octets(value)))


def ticket(realm: str, sname: tuple, etype: int = 18, kvno: int = 2) -> bytes:
    return tlv(0x61, seq(ctx(0, integer(5)), ctx(1, kstr(realm)), ctx(2, principal(2, *sname)),
                         ctx(3, enc_data(etype, kvno, b"T" * 16))))


def ap_req(tkt: bytes, auth_etype: int = 18) -> bytes:
    return tlv(0x6E, seq(ctx(0, integer(5)), ctx(1, integer(14)), ctx(2, tlv(0x03, b"\x00\x00\x00\x00\x00")),
                         ctx(3, tkt), ctx(4, enc_data(auth_etype, None, b"A" * 8))))


def kdc_req(app: int = 10, *, padata=(), cname=("alice",), realm="EXAMPLE.COM", sname=("krbtgt", "EXAMPLE.COM"),
            nonce=12345, etypes=(18, 17, 23), options=b"\x00\x40\x81\x00\x10", till="20370913024805Z",
            msg_type=None) -> bytes:
    body = [ctx(0, tlv(0x03, options))]
    if cname is not None:
        body.append(ctx(1, principal(1, *cname)))
    body.append(ctx(2, kstr(realm)))
    if sname is not None:
        body.append(ctx(3, principal(2, *sname)))
    body += [ctx(5, ktime(till)), ctx(7, integer(nonce)), ctx(8, seq(*[integer(e) for e in etypes]))]
    parts = [ctx(1, integer(5)), ctx(2, integer(app if msg_type is None else msg_type))]
    if padata:
        parts.append(ctx(3, seq(*padata)))
    parts.append(ctx(4, seq(*body)))
    return tlv(0x60 | app, seq(*parts))


def kdc_rep(app: int = 11, *, crealm="EXAMPLE.COM", cname=("alice",), tkt=None, enc_etype=18, enc_kvno=3,
            padata=()) -> bytes:
    tkt = tkt if tkt is not None else ticket("EXAMPLE.COM", ("krbtgt", "EXAMPLE.COM"))
    parts = [ctx(0, integer(5)), ctx(1, integer(app))]
    if padata:
        parts.append(ctx(2, seq(*padata)))
    parts += [ctx(3, kstr(crealm)), ctx(4, principal(1, *cname)), ctx(5, tkt), ctx(6, enc_data(enc_etype, enc_kvno))]
    return tlv(0x60 | app, seq(*parts))


def krb_error(code: int = 25, *, e_text=None, e_data=None, cname=("alice",), crealm="EXAMPLE.COM",
              realm="EXAMPLE.COM", sname=("krbtgt", "EXAMPLE.COM"), stime="20150119225409Z", susec=334091,
              ctime=None, cusec=None) -> bytes:
    parts = [ctx(0, integer(5)), ctx(1, integer(30))]
    if ctime:
        parts.append(ctx(2, ktime(ctime)))
    if cusec is not None:
        parts.append(ctx(3, integer(cusec)))
    parts += [ctx(4, ktime(stime)), ctx(5, integer(susec)), ctx(6, integer(code))]
    if crealm:
        parts.append(ctx(7, kstr(crealm)))
    if cname:
        parts.append(ctx(8, principal(1, *cname)))
    parts += [ctx(9, kstr(realm)), ctx(10, principal(2, *sname))]
    if e_text is not None:
        parts.append(ctx(11, kstr(e_text)))
    if e_data is not None:
        parts.append(ctx(12, octets(e_data)))
    return tlv(0x7E, seq(*parts))


# --- DNS messages (RFC 1035 §4.1) -----------------------------------------------------------------

def dns_name(text: str | bytes) -> bytes:
    """Uncompressed wire name; '' or '.' is the root."""
    raw = text.encode() if isinstance(text, str) else text
    labels = [lab for lab in raw.split(b".") if lab]
    return b"".join(bytes([len(lab)]) + lab for lab in labels) + b"\0"


def dns_header(ident=0x1234, flags=0x0100, qd=1, an=0, ns=0, ar=0) -> bytes:
    return struct.pack(">HHHHHH", ident, flags, qd, an, ns, ar)


def dns_question(qname="example.com", qtype=1, qclass=1) -> bytes:
    wire = qname if isinstance(qname, bytes) and (qname.endswith(b"\0") or b"\xc0" in qname) else dns_name(qname)
    return wire + struct.pack(">HH", qtype, qclass)


def dns_rr(rtype=1, ttl=300, rdata=b"\x7f\x00\x00\x01", owner=b"\xc0\x0c", rclass=1) -> bytes:
    return owner + struct.pack(">HHIH", rtype, rclass, ttl, len(rdata)) + rdata


def dns_soa(ttl=3600, minimum=900, owner=b"\xc0\x0c") -> bytes:
    rdata = (dns_name("ns1.example.com") + dns_name("hostmaster.example.com")
             + struct.pack(">IIIII", 1, 7200, 900, 1209600, minimum))
    return dns_rr(6, ttl, rdata, owner)


def dns_opt(size=1232, ext_rcode=0, version=0, do=False, rdata=b"") -> bytes:
    ttl = (ext_rcode << 24) | (version << 16) | (0x8000 if do else 0)
    return b"\0" + struct.pack(">HHIH", 41, size, ttl, len(rdata)) + rdata


def dns_query(qname="example.com", qtype=1, ident=0x1234, flags=0x0100, edns=None) -> bytes:
    extra = dns_opt(edns) if edns else b""
    return dns_header(ident, flags, 1, 0, 0, 1 if edns else 0) + dns_question(qname, qtype) + extra


def dns_response(qname="example.com", qtype=1, ident=0x1234, rcode=0, answers=(), authority=(), additional=(),
             flags=0x8180) -> bytes:
    return (dns_header(ident, flags | rcode, 1, len(answers), len(authority), len(additional))
            + dns_question(qname, qtype) + b"".join(answers) + b"".join(authority) + b"".join(additional))


# --- message sets ----------------------------------------------------------------------------------
