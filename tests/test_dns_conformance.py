"""DNS decoder against tshark 4.0 (and Zeek's dns.log baselines) on the real captures of the corpus.

Per DNS message: id, flags, rcode (4-bit header and extended), question name/type/class, the four
counts, the minimum answer TTL (tshark's ``dns.resp.ttl`` occurrences of the answer section), the
negative-caching TTL (SOA TTL and ``dns.soa.minimum_ttl``), EDNS UDP size / extended rcode / DO.
Per frame (``-2``): ``dns.retransmission`` against our retransmission / duplicate-response flags,
``dns.unsolicited``, and ``dns.time`` against the transaction latency.

Deliberate differences, asserted below where they occur:

- ``arkime/gtp-iphone.pcap``: its 6 DNS messages travel inside a GTP-U tunnel (UDP 2152); the
  packets layer does not open tunnels, so no DNS message is seen.
- Names: tshark writes control bytes as ``\\ooo`` octal, leaves '\\' alone and shows non-ASCII
  as UTF-8; we write ``\\xNN`` (text.put_escaped). Compared only where the name is printable ASCII.
- Pairing runs in time order and keys on the question too (see analyzer/decoders/dns.py); the
  frames where tshark disagrees are listed in PAIRING_DIFFERENCES with the reason: one capture
  whose timestamps go backwards, and four cut/malformed responses on which tshark's dissection
  stops (exception) before it adds its dns.unsolicited / dns.time fields.
- Zeek: ``rtt`` exists only for replies whose answers Zeek logs; a duplicate response is a row of
  its own there (see test_transactions_match_zeek).

RR sections come from ``tshark -T json`` (see tshark_json): with ``-T fields`` the NSEC/NSEC3
type bitmaps add ``dns.resp.type`` occurrences, so occurrences cannot be attributed to RRs.
"""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import tshark_ref
from shared_captures import shared_capture
from tshark_ref import corpus_files, have_tshark

from analyzer.decoders import dns

CORPUS = Path(__file__).parent / "data" / "corpus"
ZEEK = CORPUS / "zeek-baselines"
# DNS on port 53 only (not mDNS/LLMNR), and not the DNS that ICMP errors quote.
FILTER = "dns && (udp.port==53 || tcp.port==53) && !icmp && !icmpv6"
GTP_TUNNELLED = {"arkime/gtp-iphone.pcap": 6}

DNS_FILES = sorted({r["file"] for r in corpus_files("dns")})

needs_tshark = pytest.mark.skipif(not have_tshark(), reason="tshark not installed")


def tshark_json(path: Path) -> list:
    """``tshark -2 -T json -J "frame dns"`` of the DNS frames, parsed keeping repeated keys (two DNS
    messages in one TCP segment, two RRs with the same summary): every JSON object is a list of
    (key, value) pairs. The RR sections need the tree: with ``-T fields`` NSEC/NSEC3 type bitmaps
    add ``dns.resp.type`` occurrences and OPT has no ``dns.resp.ttl``, so occurrences cannot be
    attributed to RRs. Cached like tshark_ref's runs."""
    stdout, _, _ = tshark_ref.tshark_raw(path, ["-n", "-2", "-T", "json", "-J", "frame dns", "-Y", FILTER])
    return json.loads(stdout or "[]", object_pairs_hook=list)


def _get(pairs, key, default=None):
    for k, v in pairs:
        if k == key:
            return v
    return default


def _all(pairs, key):
    return [v for k, v in pairs if k == key]


def _section(dns_layer, *names):
    for name in names:
        sec = _get(dns_layer, name)
        if sec is not None:
            return [rr for _, rr in sec]
    return []


def reference_messages(path: Path) -> list[dict]:
    """tshark's DNS messages of ``path``, one dict per message (several per frame over TCP)."""
    out = []
    for packet in tshark_json(path):
        layers = _get(_get(packet, "_source"), "layers")
        frame = int(_get(_get(layers, "frame"), "frame.number"))
        for j, d in enumerate(_all(layers, "dns")):
            flags = int(_get(d, "dns.flags"), 16)
            counts = [int(_get(d, a, _get(d, b, "0"))) for a, b in
                      (("dns.count.queries", "dns.count.zones"),
                       ("dns.count.answers", "dns.count.prerequisites"),
                       ("dns.count.auth_rr", "dns.count.updates"), ("dns.count.add_rr", None))]
            questions = _section(d, "Queries", "Zone")
            q = questions[0] if questions else None
            answers = _section(d, "Answers", "Prerequisites")
            authority = _section(d, "Authoritative nameservers", "Updates")
            additional = _section(d, "Additional records")
            opts = [rr for rr in additional if _get(rr, "dns.resp.type") == "41"]
            soas = [rr for rr in authority if _get(rr, "dns.resp.type") == "6"
                    and _get(rr, "dns.resp.ttl") is not None and _get(rr, "dns.soa.minimum_ttl") is not None]
            answer_ttls = [int(_get(rr, "dns.resp.ttl")) for rr in answers if _get(rr, "dns.resp.ttl") is not None]
            rcode = _get(_get(d, "dns.flags_tree", []), "dns.flags.rcode")
            opt = None
            if opts:
                o = opts[0]
                opt = (int(_get(o, "dns.rr.udp_payload_size")), int(_get(o, "dns.resp.ext_rcode"), 16),
                       _get(_get(o, "dns.resp.z_tree", []), "dns.resp.z.do") == "1")
            out.append({
                "frame": frame, "index": j, "id": int(_get(d, "dns.id"), 16), "flags": flags,
                "qdcount": counts[0], "ancount": counts[1], "nscount": counts[2], "arcount": counts[3],
                "qname": _get(q, "dns.qry.name") if q else None,
                "qtype": int(_get(q, "dns.qry.type")) if q and _get(q, "dns.qry.type") else None,
                "qclass": int(_get(q, "dns.qry.class"), 16) if q and _get(q, "dns.qry.class") else None,
                "rcode4": int(rcode) if rcode is not None else None,
                "answer_ttl_min": min(answer_ttls) if answer_ttls else None,
                "answer_types": [int(_get(rr, "dns.resp.type")) for rr in answers],
                "soa": (int(_get(soas[0], "dns.resp.ttl")), int(_get(soas[0], "dns.soa.minimum_ttl")))
                if soas else None,
                "opt": opt, "opts": len(opts),
                "retransmission": _get(d, "dns.retransmission") is not None,
                "retransmit_request_in": _get(d, "dns.retransmit_request_in"),
                "retransmit_response_in": _get(d, "dns.retransmit_response_in"),
                "unsolicited": _get(d, "dns.unsolicited") is not None,
                "time": _get(d, "dns.time"), "response_to": _get(d, "dns.response_to"),
                "tcp": _get(layers, "tcp") is not None,
            })
    return out


def ours(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    cap = shared_capture(path)  # the session's one decoding of this corpus file
    m = cap.frame("dns_messages")
    t = cap.frame("dns_transactions")
    m = m.with_columns(pl.int_range(pl.len()).over("frame_last").alias("index"))
    return m, t


def _printable(name: str) -> bool:
    return all(0x20 <= ord(c) < 0x7F for c in name) and "\\" not in name


def _expected_negative_ttl(msg: dict) -> int | None:
    if not msg["flags"] & 0x8000 or msg["soa"] is None:
        return None
    rcode = msg["rcode4"] | (msg["opt"][1] << 4 if msg["opt"] else 0)
    of_qtype = sum(1 for t in msg["answer_types"] if t == msg["qtype"] or msg["qtype"] == 255)
    if rcode == 3 or (rcode == 0 and of_qtype == 0):
        return min(msg["soa"])
    return None


@pytest.mark.tshark
@needs_tshark
@pytest.mark.parametrize("name", DNS_FILES)
def test_messages_match_tshark(name):
    path = CORPUS / name
    ref = reference_messages(path)
    m, _ = ours(path)
    if name in GTP_TUNNELLED:
        assert len(ref) == GTP_TUNNELLED[name] and m.height == 0  # DNS inside GTP-U: not decoded
        return
    assert m.height == len(ref), f"{name}: {m.height} messages, tshark {len(ref)}"
    by_key = {(r["frame_last"], r["index"]): r for r in m.iter_rows(named=True)}
    problems = []
    for r in ref:
        o = by_key.get((r["frame"], r["index"]))
        if o is None:
            problems.append(f"frame {r['frame']}#{r['index']}: missing")
            continue

        def check(field, want, got):
            if want != got:
                problems.append(f"frame {r['frame']}#{r['index']} {field}: tshark {want!r}, ours {got!r}")

        check("id", r["id"], o["id"])
        flags = r["flags"]
        check("qr", bool(flags & 0x8000), o["qr"])
        check("opcode", (flags >> 11) & 0xF, o["opcode"])
        for bit, col in ((10, "aa"), (9, "tc"), (8, "rd"), (7, "ra"), (6, "z"), (5, "ad"), (4, "cd")):
            check(col, bool(flags >> bit & 1), o[col])
        check("rcode (header bits)", flags & 0xF, o["rcode"] & 0xF)
        if r["rcode4"] is not None:
            check("dns.flags.rcode", r["rcode4"], o["rcode"] & 0xF)
        for c in ("qdcount", "ancount", "nscount", "arcount"):
            check(c, r[c], o[c])
        if r["qname"] is not None and _printable(r["qname"]):
            check("qname", r["qname"], o["qname"])
        elif r["qname"] is not None:
            assert o["qname"] is not None and "\\x" in o["qname"], (r["qname"], o["qname"])
        check("qtype", r["qtype"], o["qtype"])
        check("qclass", r["qclass"], o["qclass"])
        check("answer_ttl_min", r["answer_ttl_min"], o["answer_ttl_min"])
        check("negative_ttl", _expected_negative_ttl(r), o["negative_ttl"])
        check("edns", r["opt"] is not None, o["edns"])
        if r["opt"] is not None:
            size, ext, do = r["opt"]
            check("edns_udp_size", size, o["edns_udp_size"])
            check("edns_do", do, o["edns_do"])
            check("rcode (extended)", ext, o["rcode"] >> 4)
    assert not problems, f"{name}:\n" + "\n".join(problems)


# Where pairing in time order with the question in the key disagrees with Wireshark (frame order,
# conversation + id), per (file, frame): what tshark says, and why we differ.
PAIRING_DIFFERENCES = {
    ("arkime/dns-flags0110.pcap", 1): (
        "tshark: dns.unsolicited. The response is stored before its query (timestamps go backwards); "
        "in time order it answers frame 2, so it is not unsolicited here"),
    ("dpkt/truncated_dns.pcap", 1): (
        "tshark: no flag. A response whose query is not in the capture is unsolicited; tshark's "
        "dissection of this cut message stops (exception) before it adds dns.unsolicited"),
    ("dpkt/truncated_dns_2.pcap", 1): "tshark: no flag. Same: cut message, no query in the capture",
    ("zeek/dns/dns-edns-bad-length.pcap", 1): (
        "tshark: no flag. Same: malformed EDNS option, no query in the capture"),
    ("tcpdump/dns_udp_2.pcap", 2): (
        "tshark: no dns.time. The response (snaplen 98) answers frame 1 after 130.36 ms; tshark's "
        "dissection of the cut message stops before it adds dns.response_to/dns.time"),
}


@pytest.mark.tshark
@needs_tshark
@pytest.mark.parametrize("name", DNS_FILES)
def test_pairing_matches_tshark(name):
    """dns.retransmission (queries: retransmission; responses: duplicate_response), dns.unsolicited
    and dns.time (the latency of the transaction the response answers), per message."""
    path = CORPUS / name
    ref = reference_messages(path)
    m, t = ours(path)
    by_key = {(r["frame_last"], r["index"]): r for r in m.iter_rows(named=True)}
    txns = [r for r in t.iter_rows(named=True)]
    latency = {r["response_frame"]: r["latency_ns"] for r in txns if r["answered"]}
    request_of = {r["response_frame"]: r["request_frame"] for r in txns if r["answered"]}
    retried = {r["request_frame"] for r in txns if r["retries"]}
    duplicated = {r["response_frame"] for r in txns if r["duplicate_responses"]}
    seen, problems = set(), []
    for r in ref:
        o = by_key.get((r["frame"], r["index"]))
        if o is None:
            continue  # counted by test_messages_match_tshark
        where = (name, r["frame"])
        got = {"retransmission": bool(o["duplicate_response"] if o["qr"] else o["retransmission"]),
               "unsolicited": bool(o["unsolicited"]),
               "time": latency.get(r["frame"]) if o["qr"] and not o["duplicate_response"] else None}
        want = {"retransmission": r["retransmission"], "unsolicited": r["unsolicited"],
                "time": round(float(r["time"]) * 1e9) if r["time"] is not None and not r["retransmission"]
                else None}
        # the frames tshark points at: the original query / response of a retransmission, the
        # query a response answers
        if r["retransmit_request_in"] is not None and int(r["retransmit_request_in"]) not in retried:
            problems.append(f"frame {r['frame']}: original query {r['retransmit_request_in']} has no retries here")
        if r["retransmit_response_in"] is not None and int(r["retransmit_response_in"]) not in duplicated:
            problems.append(f"frame {r['frame']}: original response {r['retransmit_response_in']} has no duplicates")
        if want["time"] is not None and got["time"] is not None and request_of[r["frame"]] != int(r["response_to"]):
            problems.append(f"frame {r['frame']}: answers {request_of[r['frame']]}, tshark {r['response_to']}")
        if got != want:
            if where in PAIRING_DIFFERENCES:
                seen.add(where)
            else:
                problems.append(f"frame {r['frame']}: tshark {want}, ours {got}")
    assert not problems, f"{name}:\n" + "\n".join(problems)
    expected = {w for w in PAIRING_DIFFERENCES if w[0] == name}
    assert seen == expected, f"explained differences that no longer occur: {expected - seen}"


def _zeek_dns_log(path: Path) -> pl.DataFrame:
    lines = path.read_text().splitlines()
    fields = next(line.split("\t")[1:] for line in lines if line.startswith("#fields"))
    rows = [line.split("\t") for line in lines if not line.startswith("#")]
    return pl.DataFrame([dict(zip(fields, row)) for row in rows])


ZEEK_DNS = sorted(p for p in ZEEK.rglob("dns.log"))


@pytest.mark.parametrize("log", ZEEK_DNS, ids=[str(p.relative_to(ZEEK)) for p in ZEEK_DNS])
def test_transactions_match_zeek(log):
    """Zeek's dns.log rows on port 53 against our transactions: trans_id, query, qtype, rcode, and
    rtt within 1 µs.

    Zeek differences, asserted: Zeek sets ``rtt`` only when it logs an answer (``answers``), which it
    does not for NXDOMAIN, empty NOERROR or TKEY replies (``rtt`` is ``-`` there); a duplicate
    response is a log row of its own (qtype ``-``), a ``duplicate_responses`` count here."""
    parts = log.relative_to(ZEEK).parts  # <path of the trace under zeek/>/<zeek test>/dns.log
    capture = CORPUS / "zeek" / Path(*parts[:-2])
    zeek = _zeek_dns_log(log).filter(pl.col("id.resp_p") == "53")
    _, t = ours(capture)
    txns = [r for r in t.iter_rows(named=True)]
    used = set()
    problems = []
    for z in zeek.iter_rows(named=True):
        key = (z["id.orig_h"], int(z["id.orig_p"]), z["id.resp_h"], int(z["id.resp_p"]), z["proto"],
               int(z["trans_id"]), z["query"])
        matches = [k for k, r in enumerate(txns) if k not in used and
                   (str(r["client"]), r["client_port"], str(r["server"]), r["server_port"], str(r["transport"]),
                    r["id"], r["resource"]) == key]
        if z["qtype"] == "-":  # a response Zeek could not match to a query: our duplicate response
            dup = [r for r in txns if (str(r["client"]), r["client_port"], r["id"], r["resource"])
                   == (key[0], key[1], key[5], key[6]) and r["duplicate_responses"]]
            if not dup:
                problems.append(f"{key}: Zeek row without query, no duplicate response here")
            continue
        if not matches:
            problems.append(f"{key}: no transaction")
            continue
        k = matches[0]
        used.add(k)
        r = txns[k]
        if int(z["qtype"]) != r["qtype"]:
            problems.append(f"{key}: qtype Zeek {z['qtype']}, ours {r['qtype']}")
        if (None if z["rcode"] == "-" else int(z["rcode"])) != r["rcode"]:
            problems.append(f"{key}: rcode Zeek {z['rcode']}, ours {r['rcode']}")
        if z["rtt"] != "-":
            if r["latency_ns"] is None or abs(float(z["rtt"]) * 1e9 - r["latency_ns"]) > 1000:
                problems.append(f"{key}: rtt Zeek {z['rtt']}, ours {r['latency_ns']} ns")
        elif z["answers"] != "-":
            problems.append(f"{key}: Zeek logged answers but no rtt")
        else:  # Zeek's rtt comes with a logged answer; none for NXDOMAIN, NODATA or TKEY replies
            assert r["answered"] is False or r["answer_ttl_min"] is None or z["qtype_name"] == "TKEY", key
    assert not problems, "\n".join(problems)
    assert len(used) == zeek.filter(pl.col("qtype") != "-").height
