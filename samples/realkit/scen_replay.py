"""Kerberos replay: a captured LDAP SASL/GSSAPI bind and a captured TGS-REQ sent again, byte for byte.

Topology: [srv] s0 10.77.0.88 (MIT krb5kdc) + 10.77.0.89 (slapd, SASL GSSAPI) ====veth==== lan0 [lan]
client 10.77.4.1, replayer 10.77.4.66 (when the replays come from a second address).

The client is Debian's kinit, then ``ldapwhoami -Y GSSAPI`` (Cyrus SASL's GSSAPI plugin, MIT GSS-API)
against slapd, whose service key ldap/10.77.0.89@CORP.EXAMPLE is in a keytab (KRB5_KTNAME); slapd's
MIT replay cache is a file in the work directory (KRB5RCACHEDIR). The legitimate bind is captured;
its first bindRequest (the one carrying the GSS-API initial token, i.e. the AP-REQ) is read back out of
the live capture with tshark, and a raw socket sends exactly those bytes again on fresh TCP
connections: slapd's replay cache must reject them (bindResponse invalidCredentials; slapd's log
says why). The client's TGS-REQ for the LDAP service is sent again the same way as UDP datagrams to the
KDC, whose lookaside cache answers identical requests with its previous reply (krb5kdc logs
"repeated (retransmitted?) request").

The healthy twin: the same number of fresh authentications: ldapwhoami runs (each a new authenticator
on the cached service ticket) and kvno --no-store runs (each a new TGS-REQ).
"""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import ldap3
from ldap3.core.exceptions import LDAPException

from .core import ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, log, wait_for
from .scen_krb import REALM, start_mit_kdc
from .scen_ldap import slapd_conf_head

KDC = "10.77.0.88"
SLAPD = "10.77.0.89"
CLIENT = "10.77.4.1"
REPLAYER = "10.77.4.66"
BASE = "dc=corp,dc=example"
USER = "alice"
USER_PW = "hsreal-alice-Pw-7731"
LDAP_SPN = f"ldap/{SLAPD}"
NEW = ["replay", "saturation", "incast", "replication_conflict"]  # this round's detectors (not in core.ALL_DETECTORS)


def setup(lab: Lab, rcache: bool = True) -> dict:
    """Namespaces, KDC (with the LDAP service key in a keytab), slapd with SASL GSSAPI (its MIT replay
    cache off with ``rcache`` False: KRB5RCACHETYPE=none)."""
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    srv.ip("addr", "add", f"{KDC}/16", "dev", "s0")
    srv.ip("addr", "add", f"{SLAPD}/16", "dev", "s0")
    lan.ip("addr", "add", f"{CLIENT}/16", "dev", "lan0")     # the first address: the default source
    lan.ip("addr", "add", f"{REPLAYER}/16", "dev", "lan0")
    d = lab.workdir / "kdc"
    keytab = lab.workdir / "ldap.keytab"
    cmds = [f"addprinc -pw {USER_PW} +requires_preauth {USER}", f"addprinc -randkey {LDAP_SPN}",
            f"ktadd -k {keytab} {LDAP_SPN}"]
    kdc, kdc_log = start_mit_kdc(lab, srv, d, cmds, "hsreal-master-pw")
    krb5_conf = d / "krb5.conf"
    sd = lab.workdir / "slapd"
    (sd / "db").mkdir(parents=True)
    use_rcache, rcache = rcache, lab.workdir / "rcache"
    rcache.mkdir()
    conf = sd / "slapd.conf"
    conf.write_text(slapd_conf_head(sd) + f"""sasl-host {SLAPD}
sasl-realm {REALM}
database mdb
suffix "{BASE}"
rootdn "cn=admin,{BASE}"
rootpw hsreal-admin-pw
directory {sd}/db
access to * by * read
""")
    (sd / "init.ldif").write_text(f"dn: {BASE}\nobjectClass: top\nobjectClass: dcObject\n"
                                  "objectClass: organization\no: Corp\ndc: corp\n")
    subprocess.run(["slapadd", "-f", str(conf), "-l", str(sd / "init.ldif")], check=True,
                   capture_output=True, text=True)
    env = {"KRB5_CONFIG": str(krb5_conf), "KRB5_KTNAME": f"FILE:{keytab}",
           "KRB5RCACHEDIR": str(rcache), "KRB5_TRACE": str(lab.workdir / "slapd-krb5-trace.log")}
    if not use_rcache:
        env["KRB5RCACHETYPE"] = "none"
    slapd = lab.spawn(srv, "slapd", ["slapd", "-d", "stats", "-f", str(conf), "-h", f"ldap://{SLAPD}:389/"],
                      env=env)

    def up():
        try:
            with lan:
                c = ldap3.Connection(ldap3.Server(SLAPD, 389, connect_timeout=1, get_info=ldap3.NONE),
                                     auto_bind=True, receive_timeout=2)
            c.unbind()
            return True
        except LDAPException:
            return False
    wait_for(up, 15, "slapd to answer", interval=0.2)
    cdir = lab.workdir / "client"
    cdir.mkdir()
    return dict(srv=srv, lan=lan, kdc=kdc, kdc_log=kdc_log, krb5_conf=krb5_conf, slapd=slapd, cdir=cdir,
                rcache=rcache)


def client_env(lab_env: dict, cc: str) -> dict:
    return {"KRB5_CONFIG": str(lab_env["krb5_conf"]), "KRB5CCNAME": f"FILE:{lab_env['cdir']}/{cc}",
            "HOME": str(lab_env["cdir"]), "PATH": "/usr/bin:/bin", "LANG": "C", "LDAPNOINIT": "1"}


def kinit(env: dict) -> None:
    p = subprocess.run(["kinit", f"{USER}@{REALM}"], input=USER_PW + "\n", env=env, capture_output=True,
                       text=True, timeout=30)
    if p.returncode:
        raise RuntimeError(f"kinit: {p.stderr}")


def whoami(env: dict) -> tuple[int, str]:
    """One ldapwhoami -Y GSSAPI (SASL_NOCANON: the service is ldap/<address of the URI>)."""
    p = subprocess.run(["ldapwhoami", "-N", "-Q", "-Y", "GSSAPI", "-H", f"ldap://{SLAPD}:389/"], env=env,
                       capture_output=True, text=True, timeout=30)
    return p.returncode, (p.stdout + p.stderr).strip()


def tshark_payloads(pcap: Path, display_filter: str, field: str = "tcp.payload") -> list[bytes]:
    p = subprocess.run(["tshark", "-r", str(pcap), "-Y", display_filter, "-T", "fields", "-e", field],
                       capture_output=True, text=True, timeout=60)
    return [bytes.fromhex(x.replace(":", "")) for x in p.stdout.split() if x]


def replay_ldap(data: bytes, src: str, timeout: float = 5.0) -> tuple[int | None, str]:
    """Send DATA (one captured bindRequest) on a fresh TCP connection from SRC; (resultCode, diagnostic)."""
    s = socket.create_connection((SLAPD, 389), timeout=timeout, source_address=(src, 0))
    try:
        s.sendall(data)
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
            code = bind_result(buf)
            if code is not None:
                return code
        return None, ""
    finally:
        s.close()


def bind_result(buf: bytes) -> tuple[int, str] | None:
    """(resultCode, diagnosticMessage) of a complete bindResponse at the start of BUF, else None."""
    def length(b, i):
        n = b[i]
        if n < 0x80:
            return n, i + 1
        k = n & 0x7F
        return int.from_bytes(b[i + 1:i + 1 + k], "big"), i + 1 + k
    try:
        if buf[0] != 0x30:
            return None
        total, i = length(buf, 1)
        if len(buf) < i + total:
            return None
        mlen, j = length(buf, i + 1)          # messageID
        j += mlen
        if buf[j] != 0x61:                    # [APPLICATION 1] BindResponse
            return None
        _, j = length(buf, j + 1)
        clen, j = length(buf, j + 1)          # resultCode ENUMERATED
        code = int.from_bytes(buf[j:j + clen], "big")
        j += clen
        dlen, j = length(buf, j + 1)          # matchedDN
        j += dlen
        tlen, j = length(buf, j + 1)          # diagnosticMessage
        return code, buf[j:j + tlen].decode("utf-8", "replace")
    except IndexError:
        return None


def replay_tgs(data: bytes, src: str, timeout: float = 3.0) -> bytes | None:
    """Send one captured TGS-REQ datagram from a fresh UDP socket on SRC; the KDC's answer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((src, 0))
        s.settimeout(timeout)
        s.sendto(data, (KDC, 88))
        return s.recvfrom(65535)[0]
    except OSError:
        return None
    finally:
        s.close()


TWIN_INTERVAL = 0.125   # s between the twin's ldapwhoami runs (8/s: one connection each; faster is conn churn)


def run_replay(lab: Lab, out: Path, fname: str, healthy: bool, n_ldap: int = 150, n_tgs: int = 50,
               interval: float = 0.004, src: str = CLIENT, rcache: bool = True) -> dict:
    e = setup(lab, rcache)
    lan = e["lan"]
    cap = Capture(lab, e["srv"], "s0", out / fname)
    env = client_env(e, "ccache")
    tgt_only = client_env(e, "ccache-tgt")
    rows = []   # (kind, t, outcome)
    with lan:
        time.sleep(0.3)
        kinit(env)
        shutil.copy(str(e["cdir"] / "ccache"), str(e["cdir"] / "ccache-tgt"))
        t = time.time()
        rc, text = whoami(env)                   # the legitimate bind (and its TGS-REQ)
        rows.append(("whoami", t, rc))
        if rc:
            raise RuntimeError(f"ldapwhoami -Y GSSAPI failed: {text}")
        log(f"ldapwhoami: {text}")
        time.sleep(0.5)
        pcap = out / fname
        if healthy:
            t_base = time.time()
            for k in range(n_ldap):
                time.sleep(max(0.0, t_base + k * max(interval, TWIN_INTERVAL) - time.time()))
                t = time.time()
                rc, text = whoami(env)
                rows.append(("whoami", t, rc))
            for k in range(n_tgs):
                t = time.time()
                p = subprocess.run(["kvno", "--no-store", LDAP_SPN], env=tgt_only, capture_output=True,
                                   text=True, timeout=30)
                rows.append(("kvno", t, p.returncode))
        else:
            binds = tshark_payloads(pcap, 'ldap.protocolOp == 0 && ldap.mechanism == "GSSAPI" '
                                          '&& ldap.credentials')
            tgs = tshark_payloads(pcap, "kerberos.msg_type == 12 && udp", "udp.payload")
            if not binds or not tgs:
                raise RuntimeError(f"could not read the bind ({len(binds)}) / TGS-REQ ({len(tgs)}) back")
            bind, tgs_req = binds[0], tgs[-1]
            t_base = time.time()
            for k in range(n_ldap):
                time.sleep(max(0.0, t_base + k * interval - time.time()))
                t = time.time()
                rows.append(("ldap_replay", t, replay_ldap(bind, src)))
            t_base = time.time() + 0.2
            for k in range(n_tgs):
                time.sleep(max(0.0, t_base + k * interval - time.time()))
                t = time.time()
                ans = replay_tgs(tgs_req, src)
                rows.append(("tgs_replay", t, None if ans is None else ans[0]))
        time.sleep(0.5)
    stats = cap.stop()
    slapd_log = (lab.workdir / "slapd.log").read_text(errors="replace")
    kdc_log = e["kdc_log"].read_text(errors="replace")
    return dict(rows=rows, t_first=first_packet_time(out / fname), stats=stats, slapd_log=slapd_log,
                kdc_log=kdc_log, trace=(lab.workdir / "slapd-krb5-trace.log").read_text(errors="replace")
                if (lab.workdir / "slapd-krb5-trace.log").exists() else "")


def ground_truth(r: dict) -> dict:
    """What the clients, slapd and krb5kdc logged (never a detector)."""
    rows, t0 = r["rows"], r["t_first"]
    lr = [x for x in rows if x[0] == "ldap_replay"]
    tr = [x for x in rows if x[0] == "tgs_replay"]
    who = [x for x in rows if x[0] == "whoami"]
    kv = [x for x in rows if x[0] == "kvno"]
    m = dict(
        whoami_ok=sum(1 for x in who if x[2] == 0), kvno_ok=sum(1 for x in kv if x[2] == 0),
        ldap_replays=len(lr),
        ldap_replays_rejected_49=sum(1 for x in lr if x[2] and x[2][0] == 49),
        ldap_replays_accepted=sum(1 for x in lr if x[2] and x[2][0] in (0, 14)),
        slapd_request_is_a_replay=r["slapd_log"].count("(Request is a replay)"),
        tgs_replays=len(tr), tgs_replays_answered_tgs_rep=sum(1 for x in tr if x[2] == 0x6D),
        kdc_lookaside_resends=len(re.findall(r"DISPATCH: repeated \(retransmitted\?\) request", r["kdc_log"])),
        kdc_tgs_issued=len(re.findall(r"TGS_REQ .* ISSUE", r["kdc_log"])),
        capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    if lr:
        m.update(ldap_first_replay_s=round(lr[0][1] - t0, 3), ldap_last_replay_s=round(lr[-1][1] - t0, 3),
                 ldap_replay_rate_per_s=round((len(lr) - 1) / max(lr[-1][1] - lr[0][1], 1e-6), 1))
    if tr:
        m.update(tgs_first_replay_s=round(tr[0][1] - t0, 3),
                 tgs_replay_rate_per_s=round((len(tr) - 1) / max(tr[-1][1] - tr[0][1], 1e-6), 1))
    if who:
        m.update(first_bind_s=round(who[0][1] - t0, 3))
    return m


def made_with(healthy: bool, n_ldap: int, n_tgs: int, interval: float, src: str, rcache: bool = True) -> str:
    versions = (f"krb5-kdc {deb_version('krb5-kdc')}, krb5-user {deb_version('krb5-user')}, slapd "
                f"{deb_version('slapd')}, ldap-utils {deb_version('ldap-utils')}, libsasl2-modules-gssapi-mit "
                f"{deb_version('libsasl2-modules-gssapi-mit')}")
    what = (f"{versions}. MIT krb5kdc for {REALM} on {KDC} (UDP/TCP 88, lookaside cache on: MIT's default) and "
            f"slapd (back-mdb, sasl-host {SLAPD}, Cyrus SASL GSSAPI, service key {LDAP_SPN}@{REALM} in a keytab, "
            + ("MIT file replay cache" if rcache else "NO replay cache: KRB5RCACHETYPE=none in slapd's environment")
            + f") on {SLAPD}:389. The client {CLIENT} runs kinit {USER} then one "
            "ldapwhoami -N -Y GSSAPI (TGS-REQ for the LDAP service, SASL bind with the AP-REQ). ")
    if healthy:
        return what + (f"Then {n_ldap} more ldapwhoami runs (fresh authenticators on the cached service ticket, "
                       f"one connection each, bind + whoami + unbind), one every {max(interval, TWIN_INTERVAL) * 1000:g}"
                       " ms (ldapwhoami opens a connection per run: at the replays' rate that would be connection "
                       f"churn, another pathology), and {n_tgs} kvno --no-store {LDAP_SPN} runs (fresh TGS-REQs), "
                       "sequentially. Captured on the servers' veth (full packets).")
    return what + (f"Then the first bindRequest of that bind (read back out of the capture with tshark) is sent "
                   f"again {n_ldap} times, byte for byte, from {src}, each on a fresh TCP connection, one every "
                   f"{interval * 1000:g} ms (raw socket; the bindResponse is read and the connection closed), and the "
                   f"client's TGS-REQ datagram {n_tgs} times to the KDC from fresh UDP sockets on {src}. Captured on "
                   "the servers' veth (full packets).")


def build_replay(lab: Lab, out: Path, healthy: bool, scen: str = "krb5-replay-ldap-gssapi", n_ldap: int = 150,
                 n_tgs: int = 50, interval: float = 0.004, src: str = CLIENT, rcache: bool = True) -> dict:
    fname = scen + ("-healthy" if healthy else "") + ".pcap"
    r = run_replay(lab, out, fname, healthy, n_ldap=n_ldap, n_tgs=n_tgs, interval=interval, src=src,
                   rcache=rcache)
    m = ground_truth(r)
    entry = dict(file=fname.replace(".pcap", ".pcapng"), scenario=scen, healthy=healthy,
                 twin=(scen + ".pcapng") if healthy else (scen + "-healthy.pcapng"),
                 made_with=made_with(healthy, n_ldap, n_tgs, interval, src, rcache), pcapng=True, measured=m)
    if healthy:
        entry["what_happened"] = (
            f"{m['whoami_ok']} successful SASL/GSSAPI binds, each with a fresh authenticator (slapd logged "
            f"{m['slapd_request_is_a_replay']} replays), and {m['kvno_ok']} fresh TGS-REQs answered by the KDC "
            f"({m['kdc_tgs_issued']} tickets issued, {m['kdc_lookaside_resends']} lookaside resends). No replay.")
        entry["silent"] = list(ALL_DETECTORS) + NEW
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"One legitimate GSSAPI bind, then {m['ldap_replays']} byte-identical copies of its AP-REQ-carrying "
        f"bindRequest at {m.get('ldap_replay_rate_per_s')}/s from {src}: "
        + (f"slapd rejected {m['ldap_replays_rejected_49']} with invalidCredentials (49, 'SASL(-13): authentication "
           "failure: GSSAPI Failure: gss_accept_sec_context') and logged 'Request is a replay' "
           f"{m['slapd_request_is_a_replay']} times" if rcache else
           f"with no replay cache slapd ACCEPTED {m['ldap_replays_accepted']} (saslBindInProgress with its AP-REP; "
           f"{m['ldap_replays_rejected_49']} rejected, 'Request is a replay' logged {m['slapd_request_is_a_replay']} "
           "times): a replayer holding the session key could complete the bind; ours does not, and closes")
        + "; "
        f"then {m['tgs_replays']} copies of the TGS-REQ, {m['tgs_replays_answered_tgs_rep']} answered with a TGS-REP "
        f"and krb5kdc logged {m['kdc_lookaside_resends']} 'repeated (retransmitted?) request ... resending previous "
        "response' (its lookaside cache).")
    # conn_churn (one bind per fresh connection) and retry_storm (the same failing bind again and again)
    # read the same flood in their own terms: neither required nor forbidden
    entry["silent"] = ["herd", "smb_break_queue", "tcp_stall", "toctou"] + [d for d in NEW if d != "replay"]
    entry["also_acceptable"] = ["conn_churn", "retry_storm"]
    entry["expect"] = [
        dict(detector="replay", kind="authenticator_replay",
             min_severity="high" if src == CLIENT or not rcache else "medium",
             start_s=m["ldap_first_replay_s"], tolerance_s=1.0, client="", server=SLAPD,
             resource=f"{LDAP_SPN}@{REALM}", count=1, count_tolerance=0,
             measured=dict(copies=m["ldap_replays"], rejected=m["ldap_replays_rejected_49"],
                           accepted=m["ldap_replays_accepted"], rate_per_s=m.get("ldap_replay_rate_per_s"))),
        dict(detector="replay", kind="kdc_request_repeat", min_severity="medium", start_s=m["tgs_first_replay_s"],
             tolerance_s=1.0, client="", server=KDC, resource=f"{LDAP_SPN}@{REALM}", count=1, count_tolerance=0,
             measured=dict(copies=m["tgs_replays"], lookaside_resends=m["kdc_lookaside_resends"])),
    ]
    return entry
