"""What tshark sees in each sample capture: the facts recorded in MANIFEST.toml's
``[capture.tshark]`` tables and re-checked by tests/test_samples_real.py.

Only stable facts go here (distinct clients, presence and rough counts of the protocol events
the scenario is about), never exact packet counts that vary from run to run.  Each fact has
a tolerance (absolute) in TOLERANCE; the tests accept |seen - recorded| <= tolerance.

Pure standard library plus the ``tshark`` binary (Debian's tshark 4.0 when these were made).
"""
from __future__ import annotations

import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

TSHARK = shutil.which("tshark") or "/usr/bin/tshark"


def tshark_rows(path: Path | str, display_filter: str, fields: list[str],
                extra: list[str] | None = None) -> list[list[str]]:
    argv = [TSHARK, "-n", "-r", str(path), "-Y", display_filter, "-T", "fields",
            "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=,"]
    argv += extra or []
    for f in fields:
        argv += ["-e", f]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"tshark failed on {path}: {p.stderr.strip()[:500]}")
    rows = []
    for line in p.stdout.splitlines():
        parts = line.split("\t")
        parts += [""] * (len(fields) - len(parts))
        rows.append(parts)
    return rows


def tshark_frames(path: Path | str) -> tuple[int, float]:
    """(number of frames, seconds from the first to the last); raises if tshark reports an
    error reading the file."""
    p = subprocess.run([TSHARK, "-n", "-r", str(path), "-T", "fields",
                        "-e", "frame.time_relative"], capture_output=True, text=True, timeout=300)
    if p.returncode != 0 or "appears to have been cut short" in p.stderr:
        raise RuntimeError(f"tshark could not read {path}: {p.stderr.strip()[:500]}")
    times = p.stdout.split()
    return len(times), (float(times[-1]) if times else 0.0)


def tshark_reads(path: Path | str) -> int:
    """Number of frames; raises if tshark reports an error reading the file."""
    return tshark_frames(path)[0]


def max_distinct_in_window(events: list[tuple[float, str]], window: float) -> int:
    """Largest number of distinct keys among events within any `window` seconds."""
    events = sorted(events)
    best, j = 0, 0
    cnt: Counter = Counter()
    for i, (t, k) in enumerate(events):
        cnt[k] += 1
        while events[j][0] < t - window:
            kk = events[j][1]
            cnt[kk] -= 1
            if cnt[kk] == 0:
                del cnt[kk]
            j += 1
        best = max(best, len(cnt))
    return best


def bursts(events: list[tuple[float, str]], window: float, min_distinct: int,
           gap: float = 1.0) -> list[tuple[float, int]]:
    """Bursts: groups of events (separated by > gap s of quiet) whose distinct keys within
    `window` s of the group's first event reach min_distinct. Returns (start, distinct)."""
    events = sorted(events)
    groups: list[list[tuple[float, str]]] = []
    for ev in events:
        if groups and ev[0] - groups[-1][-1][0] <= gap:
            groups[-1].append(ev)
        else:
            groups.append([ev])
    out = []
    for g in groups:
        t0 = g[0][0]
        d = len({k for t, k in g if t - t0 <= window})
        if d >= min_distinct:
            out.append((round(t0, 3), d))
    return out


# ----------------------------------------------------------------------------- per scenario
def _dns_queries(path, server: str, name: str | None = None):
    flt = f"dns.flags.response == 0 && ip.dst == {server} && !icmp"
    if name:
        flt += f' && dns.qry.name == "{name}"'
    rows = tshark_rows(path, flt, ["frame.time_relative", "ip.src", "udp.srcport", "dns.id"])
    return [(float(r[0]), r[1], r[2], r[3]) for r in rows]


def dns_ttl_herd(path) -> dict:
    q = _dns_queries(path, "10.77.0.53", "api.corp.example")
    ev = [(t, src) for t, src, _, _ in q]
    up = _dns_queries(path, "10.77.0.54", "api.corp.example")
    ans = tshark_rows(path, "dns.flags.response == 1 && ip.src == 10.77.0.53 && !icmp",
                      ["dns.resp.ttl"])
    ttls = Counter(int(r[0].split(",")[0]) for r in ans if r[0])
    return {
        "dns_clients": len({s for _, s in ev}),
        "dns_queries_to_resolver": len(ev),
        "upstream_queries": len(up),
        "max_clients_in_100ms": max_distinct_in_window(ev, 0.1),
        "herds_30_clients_in_100ms": len(bursts(ev, 0.1, 30, gap=0.5)),
        "answers_ttl_0": ttls.get(0, 0),
    }


def dns_retry_storm(path) -> dict:
    q = _dns_queries(path, "10.77.0.53", "db.corp.example")
    per_query = Counter((src, port, qid) for _, src, port, qid in q)
    resent = [n for n in per_query.values() if n > 1]
    up = _dns_queries(path, "10.77.0.54", "db.corp.example")
    answered = tshark_rows(path, "dns.flags.response == 1 && ip.src == 10.77.0.53 && !icmp",
                           ["ip.dst", "udp.dstport", "dns.id"])
    answered_keys = {(r[0], r[1], r[2]) for r in answered}
    return {
        "dns_clients": len({src for _, src, _, _ in q}),
        "queries_to_resolver": len(q),
        "distinct_queries": len(per_query),
        "queries_resent": len(resent),
        "resends": sum(n - 1 for n in resent),
        "max_sends_one_query": max(per_query.values(), default=0),
        "forwarded_upstream": len(up),
        "queries_answered": len(answered_keys & set(per_query)),
    }


FACTS = {
    "dns-ttl-herd": dns_ttl_herd,
    "dns-retry-storm": dns_retry_storm,
}

# absolute tolerances, used by the tests (a rebuilt capture may differ by this much)
TOLERANCE = {
    "dns-ttl-herd": dict(dns_clients=0, dns_queries_to_resolver=6, upstream_queries=2,
                         max_clients_in_100ms=12, herds_30_clients_in_100ms=1, answers_ttl_0=25),
    "dns-retry-storm": dict(dns_clients=0, queries_to_resolver=120, distinct_queries=30,
                            queries_resent=20, resends=120, max_sends_one_query=6,
                            forwarded_upstream=150, queries_answered=30),
}


def facts_for(scenario: str, path) -> dict:
    fn = FACTS.get(scenario)
    return fn(path) if fn else {}


def tolerance_for(scenario: str, fact: str, value) -> float:
    tol = TOLERANCE.get(scenario, {}).get(fact)
    if tol is None:
        return max(1, abs(value) * 0.2) if isinstance(value, (int, float)) else 0
    return tol


def krb5_herd(path) -> dict:
    rows = tshark_rows(path, "kerberos", ["frame.time_relative", "ip.src", "kerberos.msg_type",
                                          "kerberos.error_code", "tcp.srcport"])
    for r in rows:  # a TGS-REQ also carries the AP-REQ's msg-type 14: keep the outer one
        r[2] = r[2].split(",")[0]
        r[3] = r[3].split(",")[0]
    as_req = [(float(r[0]), r[1]) for r in rows if r[2] == "10"]
    msg = Counter(r[2] for r in rows)
    err = Counter(r[3] for r in rows if r[2] == "30")
    return {
        "krb_clients": len({s for _, s in as_req}),
        "tcp_clients": len({r[1] for r in rows if r[2] == "10" and r[4]}),
        "as_req": msg.get("10", 0), "as_rep": msg.get("11", 0),
        "tgs_req": msg.get("12", 0), "tgs_rep": msg.get("13", 0),
        "krb_error_25_preauth_required": err.get("25", 0),
        "krb_error_24_preauth_failed": err.get("24", 0),
        "krb_error_6_principal_unknown": err.get("6", 0),
        "max_clients_as_req_in_1s": max_distinct_in_window(as_req, 1.0),
    }


FACTS["krb5-as-tgs-herd"] = krb5_herd
TOLERANCE["krb5-as-tgs-herd"] = dict(
    krb_clients=0, tcp_clients=0, as_req=2, as_rep=0, tgs_req=0, tgs_rep=0,
    krb_error_25_preauth_required=2, krb_error_24_preauth_failed=0,
    krb_error_6_principal_unknown=0, max_clients_as_req_in_1s=8)


def _ldap_ops(path):
    rows = tshark_rows(path, "ldap", ["frame.time_relative", "ip.src", "tcp.srcport",
                                      "ldap.protocolOp", "ldap.resultCode", "ldap.baseObject",
                                      "ldap.object"])
    ops = []
    for r in rows:
        # one TCP segment may carry several LDAP messages
        for i, op in enumerate(r[3].split(",")):
            if op == "":
                continue
            rc = r[4].split(",")
            ops.append(dict(t=float(r[0]), src=r[1], port=r[2], op=int(op),
                            rc=rc[i] if i < len(rc) else "", base=r[5], obj=r[6]))
    return ops


def ldap_conn_churn(path) -> dict:
    syns = tshark_rows(path, "tcp.flags.syn == 1 && tcp.flags.ack == 0 && tcp.dstport == 389",
                       ["ip.src"])
    ops = _ldap_ops(path)
    c = Counter(o["op"] for o in ops)
    return {"ldap_clients": len({o["src"] for o in ops if o["op"] in (0, 3)}),
            "tcp_connections_to_389": len(syns),
            "bind_requests": c.get(0, 0), "search_requests": c.get(3, 0),
            "unbind_requests": c.get(2, 0),
            "search_entries": c.get(4, 0)}


def ldap_toctou(path) -> dict:
    ops = _ldap_ops(path)
    counter = "cn=uid-pool,ou=counters,dc=corp,dc=example"
    reads = [o for o in ops if o["op"] == 3 and o["base"] == counter]
    writes = [o for o in ops if o["op"] == 6 and o["obj"] == counter]
    results = Counter(o["rc"] for o in ops if o["op"] == 7)
    outstanding: dict[str, bool] = {}
    overlaps = 0
    for o in sorted(reads + writes, key=lambda o: o["t"]):
        if o["op"] == 3:
            if any(v for k, v in outstanding.items() if k != o["src"]):
                overlaps += 1
            outstanding[o["src"]] = True
        else:
            outstanding[o["src"]] = False
    return {"ldap_clients": len({o["src"] for o in reads}),
            "counter_reads": len(reads), "counter_modifies": len(writes),
            "modify_success": results.get("0", 0),
            "modify_no_such_attribute": results.get("16", 0),
            "overlapping_read_modify_windows": overlaps}


FACTS["ldap-conn-churn"] = ldap_conn_churn
FACTS["ldap-toctou"] = ldap_toctou
TOLERANCE["ldap-conn-churn"] = dict(ldap_clients=0, tcp_connections_to_389=0, bind_requests=0,
                                    search_requests=0, unbind_requests=0, search_entries=0)
TOLERANCE["ldap-toctou"] = dict(ldap_clients=0, counter_reads=8, counter_modifies=8,
                                modify_success=2, modify_no_such_attribute=6,
                                overlapping_read_modify_windows=6)


def _smb2(path):
    rows = tshark_rows(path, "smb2", ["frame.time_relative", "ip.src", "smb2.cmd",
                                      "smb2.nt_status", "smb2.flags.response", "smb2.msg_id",
                                      "smb2.filename"])
    msgs = []
    for r in rows:
        cmds = r[2].split(",")
        sts = r[3].split(",")
        resp = r[4].split(",")
        mids = r[5].split(",")
        for i, c in enumerate(cmds):
            if c == "":
                continue
            msgs.append(dict(t=float(r[0]), src=r[1], cmd=int(c),
                             status=sts[i] if i < len(sts) else "",
                             resp=(resp[i] if i < len(resp) else "") in ("1", "True"),
                             mid=(mids[i] if i < len(mids) else ""),
                             name=r[6]))
    return msgs


def _smb2_common(msgs) -> dict:
    breaks = [m for m in msgs if m["cmd"] == 18 and m["mid"] == "18446744073709551615"]
    # interim responses to CREATE only: smbd also answers READ/WRITE asynchronously at random
    pending = [m for m in msgs if m["resp"] and m["status"] == "0x00000103" and m["cmd"] == 5]
    return {"smb2_clients": len({m["src"] for m in msgs if not m["resp"]}),
            "smb2_creates": sum(1 for m in msgs if m["cmd"] == 5 and not m["resp"]),
            "smb2_break_notifications": len(breaks),
            "smb2_break_acks_from_clients": sum(1 for m in msgs if m["cmd"] == 18
                                                and not m["resp"]),
            "smb2_create_pending": len(pending)}


def smb2_breaks(path) -> dict:
    rows = tshark_rows(path, "smb2.cmd == 5", ["frame.time_relative", "ip.src", "ip.dst",
                                                "smb2.msg_id", "smb2.nt_status",
                                                "smb2.flags.response"])
    sent: dict[tuple, float] = {}
    waits = []
    for t, src, dst, mid, st, resp in rows:
        if resp in ("0", "False"):
            sent[(src, mid)] = float(t)
        elif st != "0x00000103" and (dst, mid) in sent:
            waits.append(float(t) - sent.pop((dst, mid)))
    d = _smb2_common(_smb2(path))
    d["smb2_max_create_ms"] = round(max(waits, default=0.0) * 1000, 1)
    return d


def smb2_toctou(path) -> dict:
    msgs = _smb2(path)
    d = _smb2_common(msgs)
    d["smb2_set_info"] = sum(1 for m in msgs if m["cmd"] == 17 and not m["resp"])
    d["smb2_query_info"] = sum(1 for m in msgs if m["cmd"] == 16 and not m["resp"])
    d["smb2_sharing_violations"] = sum(1 for m in msgs if m["status"] == "0xc0000043")
    return d


FACTS["smb2-oplock-lease-break"] = smb2_breaks
FACTS["smb2-break-queue"] = smb2_breaks
FACTS["smb2-toctou"] = smb2_toctou
for _s in ("smb2-oplock-lease-break", "smb2-break-queue"):
    TOLERANCE[_s] = dict(smb2_clients=0, smb2_creates=0, smb2_break_notifications=0,
                         smb2_max_create_ms=300.0,
                         smb2_break_acks_from_clients=1, smb2_create_pending=2)
TOLERANCE["smb2-toctou"] = dict(smb2_clients=0, smb2_creates=4, smb2_break_notifications=0,
                                smb2_break_acks_from_clients=2, smb2_create_pending=2,
                                smb2_set_info=0, smb2_query_info=0, smb2_sharing_violations=3)


def _tcp_data(path, src: str):
    rows = tshark_rows(path, f"ip.src == {src} && tcp.len > 0",
                       ["frame.time_relative", "tcp.len", "tcp.analysis.retransmission"])
    return [(float(r[0]), int(r[1]), r[2] != "") for r in rows]


def tcp_common(path) -> dict:
    syn = tshark_rows(path, "tcp.flags.syn == 1 && tcp.flags.ack == 0", ["ip.src"])
    rtx = tshark_rows(path, "tcp.analysis.retransmission", ["frame.number"])
    return {"tcp_connections": len(syn), "retransmissions": len(rtx)}


def tcp_slow_start_idle(path) -> dict:
    data = _tcp_data(path, "10.77.5.1")
    groups: list[list] = []
    for t, n, _ in data:
        if groups and t - groups[-1][-1] <= 1.0:
            groups[-1].append(t)
        else:
            groups.append([t])
    durs = [round((g[-1] - g[0]) * 1000, 1) for g in groups]
    d = tcp_common(path)
    d.update(bursts=len(groups), first_burst_ms=durs[0] if durs else 0.0,
             later_bursts_mean_ms=round(sum(durs[1:]) / max(1, len(durs) - 1), 1))
    return d


def tcp_rto_blackout(path) -> dict:
    data = _tcp_data(path, "10.77.5.1")
    gaps = [b[0] - a[0] for a, b in zip(data, data[1:])]
    d = tcp_common(path)
    d.update(max_data_gap_ms=round(max(gaps, default=0.0) * 1000, 1),
             data_gaps_over_300ms=sum(1 for g in gaps if g > 0.3))
    return d


def tcp_nagle(path) -> dict:
    data = _tcp_data(path, "10.77.5.2")
    held = 0
    last_header = None
    for t, n, _ in data:
        if n == 20:
            last_header = t
        elif n == 200 and last_header is not None:
            if t - last_header > 0.03:
                held += 1
            last_header = None
    d = tcp_common(path)
    d.update(requests=sum(1 for _, n, _ in data if n in (20, 220)),
             bodies_held_over_30ms=held)
    return d


FACTS["tcp-slow-start-after-idle"] = tcp_slow_start_idle
FACTS["tcp-rto-blackout"] = tcp_rto_blackout
FACTS["tcp-nagle-delayed-ack"] = tcp_nagle
TOLERANCE["tcp-slow-start-after-idle"] = dict(tcp_connections=0, retransmissions=30, bursts=0,
                                              first_burst_ms=150.0, later_bursts_mean_ms=150.0)
TOLERANCE["tcp-rto-blackout"] = dict(tcp_connections=0, retransmissions=40,
                                     max_data_gap_ms=600.0, data_gaps_over_300ms=2)
TOLERANCE["tcp-nagle-delayed-ack"] = dict(tcp_connections=0, retransmissions=2, requests=0,
                                          bodies_held_over_30ms=6)


# ------------------------------------------------------------------ Kerberos in GSS-API carriers
def _krb_messages(path) -> list[dict]:
    """Kerberos messages one by one (a frame may carry several): outer msg-type (the AP-REQ inside a
    TGS-REQ's PA-TGS-REQ belongs to the TGS-REQ), error code, whether it went to or came from a KDC
    (port 88), and the last ``kerberos.cipher`` of an AP-REQ or TGS-REQ: the authenticator's
    ciphertext (a ticket's enc-part comes first), which only a copy of the same message repeats."""
    rows = tshark_rows(path, "kerberos", ["ip.src", "kerberos.msg_type", "kerberos.error_code",
                                          "tcp.srcport", "tcp.dstport", "udp.srcport", "udp.dstport",
                                          "kerberos.cipher"])
    out = []
    for src, types, codes, *ports, ciphers in rows:
        kdc = "88" in ports
        types = [t for t in types.split(",") if t]
        codes = [c for c in codes.split(",") if c]
        outer = [t for i, t in enumerate(types) if not (t == "14" and i and types[i - 1] == "12")]
        # several messages in one frame: their ciphers cannot be told apart (not seen in the samples)
        last_cipher = ciphers.split(",")[-1] if len(outer) == 1 else ""
        for t in outer:
            out.append(dict(src=src, type=t, kdc=kdc, cipher=last_cipher if t in ("12", "14") else "",
                            error=codes.pop(0) if t == "30" and codes else ""))
    return out


def krb5_carrier_replay(path) -> dict:
    """The KDC exchanges (the keys tests/test_samples_decode.py compares with kerberos_messages) and
    the AP exchanges inside the carriers (HTTP Negotiate, LDAP SASL GSSAPI): AP-REQs, distinct
    authenticators among them and the copies beyond the first of each (what the service's replay
    cache sees), AP-REPs, KRB_AP_ERR_REPEAT (34) errors; TGS-REQs repeated byte for byte (the same
    PA-TGS-REQ authenticator: what the KDC's lookaside cache sees)."""
    msgs = _krb_messages(path)
    kdc = Counter(m["type"] for m in msgs if m["kdc"])
    err = Counter(m["error"] for m in msgs if m["type"] == "30")
    ap = [m for m in msgs if m["type"] == "14" and not m["kdc"]]
    tgs = [m for m in msgs if m["type"] == "12" and m["kdc"]]
    ap_copies = Counter(m["cipher"] for m in ap if m["cipher"])
    tgs_copies = Counter(m["cipher"] for m in tgs if m["cipher"])
    return {"as_req": kdc.get("10", 0), "as_rep": kdc.get("11", 0),
            "tgs_req": kdc.get("12", 0), "tgs_rep": kdc.get("13", 0),
            "krb_error_25_preauth_required": err.get("25", 0),
            "krb_error_24_preauth_failed": err.get("24", 0),
            "krb_error_6_principal_unknown": err.get("6", 0),
            "ap_req_in_carriers": len(ap),
            "ap_rep_in_carriers": sum(1 for m in msgs if m["type"] == "15" and not m["kdc"]),
            "distinct_authenticators": len(ap_copies),
            "authenticator_copies": sum(n - 1 for n in ap_copies.values()),
            "krb_error_34_repeat": err.get("34", 0),
            "tgs_req_copies": sum(n - 1 for n in tgs_copies.values())}


def krb5_http_replay(path) -> dict:
    d = krb5_carrier_replay(path)
    req = tshark_rows(path, 'http.request && http.authorization contains "Negotiate"', ["ip.src"])
    status = Counter(r[0] for r in tshark_rows(path, "http.response", ["http.response.code"]))
    d.update(http_negotiate_requests=len(req), http_negotiate_clients=len({r[0] for r in req}),
             http_200=status.get("200", 0), http_401=status.get("401", 0))
    return d


def krb5_replay_ldap_gssapi(path) -> dict:
    d = krb5_carrier_replay(path)
    ops = _ldap_ops(path)
    binds = tshark_rows(path, 'ldap.protocolOp == 0 && ldap.mechanism == "GSSAPI"', ["ldap.mechanism"])
    d.update(ldap_gssapi_bind_requests=sum(len(r[0].split(",")) for r in binds),
             ldap_bind_success=sum(1 for o in ops if o["op"] == 1 and o["rc"] == "0"),
             ldap_bind_sasl_in_progress=sum(1 for o in ops if o["op"] == 1 and o["rc"] == "14"),
             ldap_bind_invalid_credentials=sum(1 for o in ops if o["op"] == 1 and o["rc"] == "49"))
    return d


FACTS["krb5-http-replay"] = krb5_http_replay
FACTS["krb5-replay-ldap-gssapi"] = krb5_replay_ldap_gssapi
_KRB_CARRIER_TOL = dict(as_req=2, as_rep=0, tgs_req=0, tgs_rep=0, krb_error_25_preauth_required=2,
                        krb_error_24_preauth_failed=0, krb_error_6_principal_unknown=0,
                        ap_req_in_carriers=0, ap_rep_in_carriers=0, distinct_authenticators=0,
                        authenticator_copies=0, krb_error_34_repeat=0, tgs_req_copies=0)
TOLERANCE["krb5-http-replay"] = dict(_KRB_CARRIER_TOL, http_negotiate_requests=0,
                                     http_negotiate_clients=0, http_200=0, http_401=0)
TOLERANCE["krb5-replay-ldap-gssapi"] = dict(_KRB_CARRIER_TOL, ldap_gssapi_bind_requests=0,
                                            ldap_bind_success=0, ldap_bind_sasl_in_progress=0,
                                            ldap_bind_invalid_credentials=0)


# ------------------------------------------------------------------ LDAP replication, saturation
REPL_PROVIDERS = ("10.77.0.91", "10.77.0.92")   # realkit/scen_ldap_repl.py's P1, P2


def ldap_repl_conflict(path) -> dict:
    """Client writes and what the two providers pushed each other (RFC 4533 Sync State controls in
    searchResultEntries: state 2 = modify): in a conflict both push the same entry; serialised
    writes through one provider are pushed by that one only."""
    ops = _ldap_ops(path)
    c = Counter(o["op"] for o in ops)
    rows = tshark_rows(path, "ldap.state", ["ip.src", "ip.dst", "ldap.state", "ldap.entryUUID"])
    states = [(r[0], r[1], s, u) for r in rows
              for s, u in zip(r[2].split(","), r[3].split(","))]
    pushes = [x for x in states if x[0] in REPL_PROVIDERS and x[1] in REPL_PROVIDERS]
    d = {"modify_requests": c.get(6, 0),
         "modify_success": sum(1 for o in ops if o["op"] == 7 and o["rc"] == "0"),
         "search_entries": c.get(4, 0),
         "sync_info_messages": c.get(25, 0),
         "sync_state_entries": len(states), "sync_entry_uuids": len({x[3] for x in states})}
    for i, p in enumerate(REPL_PROVIDERS, 1):
        d[f"sync_modifies_pushed_by_p{i}"] = sum(1 for x in pushes if x[0] == p and x[2] == "2")
    return d


SATURATION_EDGE_S = 1.0   # the first / last this many seconds of searches, for the latency facts


def ldap_saturation(path) -> dict:
    """Searches sent, answered (searchResultDone, success), entries returned, the clients, the most
    searches answered within one second, and the median response time (tshark's ldap.time) of the
    searches answered in the first and in the last SATURATION_EDGE_S seconds of the ramp."""
    ops = _ldap_ops(path)
    c = Counter(o["op"] for o in ops)
    done = tshark_rows(path, "ldap.protocolOp == 5", ["frame.time_relative", "ldap.time"])
    answered = sorted((float(r[0]), float(t)) for r in done for t in r[1].split(",") if t)
    per_s = Counter(int(t) for t, _ in answered)

    def median_ms(sel):
        v = sorted(x for _, x in sel)
        return round(v[len(v) // 2] * 1000, 2) if v else -1.0

    t0, t1 = (answered[0][0], answered[-1][0]) if answered else (0.0, 0.0)
    return {"search_requests": c.get(3, 0), "search_done": c.get(5, 0),
            "search_success": sum(1 for o in ops if o["op"] == 5 and o["rc"] == "0"),
            "search_entries": c.get(4, 0),
            "search_clients": len({o["src"] for o in ops if o["op"] == 3}),
            "max_searches_done_in_1s": max(per_s.values(), default=0),
            "median_response_ms_first_s": median_ms([a for a in answered if a[0] <= t0 + SATURATION_EDGE_S]),
            "median_response_ms_last_s": median_ms([a for a in answered if a[0] >= t1 - SATURATION_EDGE_S])}


FACTS["ldap-repl-conflict"] = ldap_repl_conflict
FACTS["ldap-saturation"] = ldap_saturation
TOLERANCE["ldap-repl-conflict"] = dict(modify_requests=0, modify_success=0, search_entries=4,
                                       sync_info_messages=6, sync_state_entries=4, sync_entry_uuids=0,
                                       sync_modifies_pushed_by_p1=2, sync_modifies_pushed_by_p2=2)
TOLERANCE["ldap-saturation"] = dict(search_requests=400, search_done=400, search_success=400,
                                    search_entries=400, search_clients=0, max_searches_done_in_1s=60,
                                    median_response_ms_first_s=10.0, median_response_ms_last_s=150.0)


# ------------------------------------------------------------------ TCP incast
INCAST_CLIENT = "10.77.14.1"   # realkit/scen_incast.py's CLIENT
INCAST_REQUEST_BYTES = 16      # its REQ: one request per server and round
RTO_SILENCE_S = 0.15           # below Linux's 200 ms minimum RTO, far above the path's RTT
ROUND_GAP_S = 0.02             # requests further apart than this start a new round


def tcp_incast(path) -> dict:
    """Servers answering the client, its requests (first copies) and their rounds, and the
    retransmissions sent after RTO_SILENCE_S or more of silence on their connection (tshark's
    tcp.time_delta: the flow sat out a retransmission timeout) and the connections that had one."""
    d = tcp_common(path)
    data = tshark_rows(path, f"ip.dst == {INCAST_CLIENT} && tcp.len > 0", ["ip.src"])
    req = tshark_rows(path, f"ip.src == {INCAST_CLIENT} && tcp.len == {INCAST_REQUEST_BYTES} && "
                      "!tcp.analysis.retransmission", ["frame.time_relative"])
    times = sorted(float(r[0]) for r in req)
    rto = tshark_rows(path, "tcp.analysis.retransmission && !tcp.analysis.fast_retransmission && "
                      f"tcp.time_delta >= {RTO_SILENCE_S}", ["tcp.stream"],
                      extra=["-o", "tcp.calculate_timestamps:TRUE"])
    d.update(servers=len({r[0] for r in data}), client_requests=len(times),
             request_rounds=sum(1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] > ROUND_GAP_S),
             rto_retransmissions=len(rto), connections_with_rto=len({r[0] for r in rto}))
    return d


FACTS["tcp-incast"] = tcp_incast
TOLERANCE["tcp-incast"] = dict(tcp_connections=0, retransmissions=150, servers=0, client_requests=0,
                               request_rounds=0, rto_retransmissions=25, connections_with_rto=8)


# the NFS scenarios' facts register themselves here (realkit/facts_nfs.py)
from . import facts_nfs  # noqa: E402,F401
