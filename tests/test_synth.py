"""samples/synth.py: determinism, exact record counts, labels, checksums, and tshark's view."""
from __future__ import annotations

import collections
import importlib.util
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ROOT / "samples" / "synth.py"
N = 5000


def _load_synth():
    spec = importlib.util.spec_from_file_location("herdscope_synth", SYNTH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


synth = _load_synth()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SYNTH), *args], capture_output=True, text=True, timeout=120)


def _records(path: Path) -> list[tuple[int, bytes]]:
    """(epoch ns, frame) for every record of a classic pcap (µs or ns magic)."""
    data = path.read_bytes()
    magic = struct.unpack_from("<I", data, 0)[0]
    assert magic in (0xA1B2C3D4, 0xA1B23C4D)
    mult = 1 if magic == 0xA1B23C4D else 1000
    assert struct.unpack_from("<I", data, 20)[0] == 1            # LINKTYPE_ETHERNET
    out, off = [], 24
    while off < len(data):
        sec, frac, caplen, wirelen = struct.unpack_from("<IIII", data, off)
        assert caplen == wirelen
        out.append((sec * 1_000_000_000 + frac * mult, data[off + 16:off + 16 + caplen]))
        off += 16 + caplen
    assert off == len(data)
    return out


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "small.pcap"
    r = _cli("--packets", str(N), "--seed", "1", "--out", str(path))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["packets"] == N
    return path


def test_deterministic_and_seeded(capture, tmp_path):
    again = tmp_path / "again.pcap"
    assert _cli("--packets", str(N), "--seed", "1", "--out", str(again), "--quiet").returncode == 0
    assert again.read_bytes() == capture.read_bytes()
    assert Path(str(again) + ".labels.json").read_bytes() == Path(str(capture) + ".labels.json").read_bytes()
    other = tmp_path / "other.pcap"
    assert _cli("--packets", str(N), "--seed", "2", "--out", str(other), "--quiet").returncode == 0
    assert other.read_bytes() != capture.read_bytes()


def test_exact_count_sorted_times(capture):
    recs = _records(capture)
    assert len(recs) == N
    ts = [t for t, _ in recs]
    assert ts == sorted(ts)
    assert all(t % 1000 == 0 for t in ts)                         # µs capture
    assert ts[-1] - ts[0] > 20 * 10**9                             # small captures still span > 20 s


def test_checksums_agree_with_dpkt(capture):
    recs = _records(capture)
    for _, frame in recs[::7]:
        assert synth.dpkt_reference_frame(frame) == frame


def test_checksum_negative_zero_corner():
    """A segment whose sum is ones'-complement zero: TCP carries 0x0000, UDP 0xFFFF (like dpkt)."""
    a = synth.Host("10.9.0.1", windows=False, local=True, rtt=1, port=40000)
    b = synth.Host("10.9.0.2", windows=False, local=True, rtt=1, port=40000)
    for proto, extra, want in ((synth.PROTO_TCP, 2, 0x0000), (synth.PROTO_UDP, 4, 0xFFFF)):
        p = synth.Path(a, b, 1234, 80, proto, 7)
        st = synth.Store()
        payload = b"0123456789abcdef"

        def build(pl):
            if proto == synth.PROTO_TCP:
                st.tcp(0, p, 1, 2, synth.ACK, 100, b"", pl)
                return st.frames[-1], 14 + 20 + 16
            st.udp(0, p, pl)
            return st.frames[-1], 14 + 20 + 6

        frame, at = build(payload)
        cs = int.from_bytes(frame[at:at + 2], "big")
        frame, at = build(payload + ((cs - extra) % 0xFFFF).to_bytes(2, "big"))
        assert int.from_bytes(frame[at:at + 2], "big") == want
        assert synth.dpkt_reference_frame(frame) == frame


def test_protocol_mix(capture):
    import dpkt
    ports = collections.Counter()
    v6 = 0
    for _, frame in _records(capture):
        eth = dpkt.ethernet.Ethernet(frame)
        ip = eth.data
        v6 += isinstance(ip, dpkt.ip6.IP6)
        l4 = ip.data
        kind = "tcp" if isinstance(l4, dpkt.tcp.TCP) else "udp"
        ports[(kind, min(l4.sport, l4.dport))] += 1
    for key in [("udp", 53), ("tcp", 53), ("udp", 88), ("tcp", 88), ("tcp", 389), ("tcp", 445),
                ("tcp", 8080), ("tcp", 80), ("udp", 514)]:
        assert ports[key] > 0, key
    assert v6 > 0


def test_labels(capture):
    labels = json.loads(Path(str(capture) + ".labels.json").read_text())
    assert isinstance(labels, list)
    assert {l["detector"] for l in labels} == set(synth.DETECTORS)
    recs = _records(capture)
    first, last = recs[0][0], recs[-1][0]
    assert [l["start_ns"] for l in labels] == sorted(l["start_ns"] for l in labels)
    for l in labels:
        assert tuple(l) == synth.LABEL_KEYS
        assert first <= l["start_ns"] <= l["end_ns"] <= last
        assert l["clients"] and l["description"] and l["resource"]
        # the episode's first and last packets are in the capture at exactly those times
        times = {t for t, _ in recs}
        assert l["start_ns"] in times and l["end_ns"] in times, l["detector"]
    herd = [l for l in labels if l["detector"] == "herd" and l["protocol"] == "dns"][0]
    assert len(set(herd["clients"])) == len(herd["clients"]) >= 12
    assert herd["parameters"]["expiry_ns"] <= herd["start_ns"]


def test_pcapng_and_nanosecond_variants(tmp_path):
    import dpkt
    pcap_ns = tmp_path / "ns.pcap"
    ng = tmp_path / "ns.pcapng"
    synth.generate(str(pcap_ns), 2000, 3, "pcap", True)
    synth.generate(str(ng), 2000, 3, "pcapng", True)
    recs = _records(pcap_ns)
    assert any(t % 1000 for t, _ in recs)                          # real ns resolution
    with open(ng, "rb") as f:
        rd = dpkt.pcapng.Reader(f)
        ng_frames = [bytes(buf) for _, buf in rd]
    assert ng_frames == [fr for _, fr in recs]
    assert Path(str(ng) + ".labels.json").read_bytes() == Path(str(pcap_ns) + ".labels.json").read_bytes()


def test_too_few_packets_is_an_error(tmp_path):
    r = _cli("--packets", "100", "--out", str(tmp_path / "x.pcap"))
    assert r.returncode == 2 and "at least" in r.stderr


def test_ldap_segment_sizes_avoid_slivers():
    sizes = synth.Ldap.segment_sizes([1443, 14, 900, 3000, 14], 1448)
    assert sum(sizes) == 1443 + 14 + 900 + 3000 + 14 and max(sizes) <= 1448
    bounds = {1443, 1457, 2357, 5357}
    ends, acc = [], 0
    for s in sizes:
        acc += s
        ends.append(acc)
    for e in ends:       # no segment ends 1..7 bytes into a message
        assert not any(0 < e - b < 8 for b in bounds if b < e) or e in bounds


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_tshark_dissects_cleanly(capture):
    bad = subprocess.run(
        ["tshark", "-n", "-r", str(capture), "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
         "-o", "udp.check_checksum:TRUE", "-Y",
         "_ws.malformed || _ws.expert.severity >= error || ip.checksum.status == 0 || "
         "tcp.checksum.status == 0 || udp.checksum.status == 0"],
        capture_output=True, text=True, timeout=120)
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.strip() == ""
    fields = subprocess.run(
        ["tshark", "-n", "-r", str(capture), "-T", "fields", "-E", "separator=|", "-e", "frame.protocols",
         "-e", "kerberos.msg_type", "-e", "kerberos.error_code", "-e", "smb2.cmd", "-e", "smb2.nt_status",
         "-e", "tcp.analysis.retransmission", "-e", "tcp.analysis.fast_retransmission",
         "-e", "tcp.analysis.zero_window", "-e", "ldap.protocolOp", "-e", "dns.flags.rcode"],
        capture_output=True, text=True, timeout=120)
    assert fields.returncode == 0, fields.stderr
    protos, krb, krb_err, smb_cmd, smb_status, ldap_ops, rcodes = (set() for _ in range(7))
    retrans = fast = zero = 0
    for line in fields.stdout.splitlines():
        p, mt, ec, cmd, st, rt, fr, zw, op, rc = line.split("|")
        protos.update(p.split(":"))
        krb.update(x for x in mt.split(",") if x)
        krb_err.update(x for x in ec.split(",") if x)
        smb_cmd.update(x for x in cmd.split(",") if x)
        smb_status.update(x for x in st.split(",") if x)
        ldap_ops.update(x for x in op.split(",") if x)
        rcodes.update(x for x in rc.split(",") if x)
        retrans += bool(rt)
        fast += bool(fr)
        zero += bool(zw)
    assert {"dns", "kerberos", "ldap", "smb2", "nbss", "http", "syslog", "ipv6", "ntlmssp", "spnego"} <= protos
    assert {"10", "11", "12", "13", "30"} <= krb
    assert {"6", "24", "25"} <= krb_err
    assert {"0", "1", "3", "5", "6", "8", "9", "18"} <= smb_cmd
    assert {"0x00000103", "0xc0000016"} <= smb_status
    assert {"0", "1", "2", "3", "4", "5", "6", "7"} <= ldap_ops
    assert {"0", "3"} <= rcodes
    assert retrans >= 2 and fast >= 1 and zero >= 1


# -- the split into samples/synthkit/ -----------------------------------------------------------------
# sha256 of captures written by samples/synth.py before it was split into samples/synthkit/ (the
# split had to keep every byte): CLI --packets 5000 --seed 1 (µs pcap) and its labels; generate(2000,
# seed 3, ns pcap / ns pcapng); Gen(21, 4000) with the loss hook at 5 % SYN / 5 % tail losses.
PINNED = {
    "cli-5000-s1.pcap": "8ada8cf0b050ecda4dce00a6c6acc28d2be0baf5a1365de4e5b86cedbcb84d89",
    "cli-5000-s1.pcap.labels.json": "09c5e6425ad86473d4cedccb58dcf3dafaac45f0fdf78ba3daf9773e7888a479",
    "gen-2000-s3-ns.pcap": "db3e253558756fcf7abbd37ad98c2357746ea3229ee068df7a9791bd971897d5",
    "gen-2000-s3-ns.pcap.labels.json": "7267ef121fc25643a061e113e374f5b9ff193f43b3314711d20c1add9f8d7905",
    "gen-2000-s3-ns.pcapng": "de43a17b7c91f0d2cef7e8fd81e1bd1a0dfaf38b09111559b2bb84ede27bf36d",
    "loss-4000-s21.pcap": "e33fc950db273a9ed93665563a972e7705eef21b567d6f90d52c6a088d1a381b",
    "loss-4000-s21.losses": "7256a8dece58d841e52cc622675ab54893779627f0db472a67b0d201155fa28b",
}


def _sha(path: Path | str) -> str:
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_output_is_pinned(capture, tmp_path):
    import hashlib
    got = {"cli-5000-s1.pcap": _sha(capture), "cli-5000-s1.pcap.labels.json": _sha(str(capture) + ".labels.json")}
    synth.generate(str(tmp_path / "g.pcap"), 2000, 3, "pcap", True)
    synth.generate(str(tmp_path / "g.pcapng"), 2000, 3, "pcapng", True)
    got["gen-2000-s3-ns.pcap"] = _sha(tmp_path / "g.pcap")
    got["gen-2000-s3-ns.pcap.labels.json"] = _sha(tmp_path / "g.pcap.labels.json")
    got["gen-2000-s3-ns.pcapng"] = _sha(tmp_path / "g.pcapng")
    g = synth.Gen(21, 4000)
    g.syn_loss_share, g.tail_loss_share = 0.05, 0.05       # samples/synth_scenarios.py's loss hook
    g.build()
    synth.write_capture(g, str(tmp_path / "l.pcap"), "pcap", False)
    got["loss-4000-s21.pcap"] = _sha(tmp_path / "l.pcap")
    got["loss-4000-s21.losses"] = hashlib.sha256(json.dumps(g.losses).encode()).hexdigest()
    assert {x[0] for x in g.losses} == {"syn", "tail"}
    assert got == PINNED


def _synth_attributes_used() -> dict[str, set[str]]:
    """Every ``synth.<name>`` / ``from synth import <name>`` in samples/ and tests/ (ast walk)."""
    import ast
    used: dict[str, set[str]] = collections.defaultdict(set)
    for path in [*(ROOT / "samples").glob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        if path == SYNTH:
            continue
        tree = ast.parse(path.read_text())
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname or a.name for a in node.names if a.name in ("synth", "samples.synth")}
            elif isinstance(node, ast.ImportFrom):
                if node.module in ("synth", "samples.synth"):
                    for a in node.names:
                        used[a.name].add(path.name)
                elif node.module == "samples":
                    aliases |= {a.asname or a.name for a in node.names if a.name == "synth"}
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and getattr(node.value.func, "id", "") == "_load_synth":
                aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                used[node.attr].add(path.name)
    return used


def test_synth_reexports_every_name_others_use():
    used = _synth_attributes_used()
    assert {"Gen", "Tcp", "write_capture", "krb_kdc_req", "dpkt_reference_frame"} <= set(used)   # the walk works
    missing = {name: sorted(where) for name, where in used.items() if not hasattr(synth, name)}
    assert not missing


def test_synthkit_modules_have_one_job_each():
    """samples/synth.py is the CLI plus re-exports; every synthkit module stays under 600 lines."""
    kit = ROOT / "samples" / "synthkit"
    sizes = {p.name: len(p.read_text().splitlines()) for p in kit.glob("*.py")}
    assert {"der.py", "kerberos.py", "ldap.py", "dns.py", "ntlm.py", "smb2.py", "frames.py", "tcp.py",
            "sessions.py", "site.py", "traffic.py", "pathologies.py", "generator.py", "writer.py"} <= set(sizes)
    assert max(sizes.values()) < 600, sizes
    assert len(SYNTH.read_text().splitlines()) < 150
    import ast
    tree = ast.parse(SYNTH.read_text())
    assert [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))] == ["main"]


def test_wire_constants_agree_with_dpkt():
    """The encoders' named constants against dpkt's own tables (an independent copy of the specs)."""
    import dpkt
    from synthkit import dns, frames, tcp, writer
    assert (dns.T_A, dns.T_NS, dns.T_CNAME, dns.T_SOA, dns.T_AAAA, dns.T_OPT, dns.CLASS_IN) == (
        dpkt.dns.DNS_A, dpkt.dns.DNS_NS, dpkt.dns.DNS_CNAME, dpkt.dns.DNS_SOA, dpkt.dns.DNS_AAAA, dpkt.dns.DNS_OPT,
        dpkt.dns.DNS_IN)
    assert (dns.FLAG_QR, dns.FLAG_TC, dns.FLAG_RD, dns.FLAG_RA, dns.RCODE_NXDOMAIN) == (
        dpkt.dns.DNS_QR, dpkt.dns.DNS_TC, dpkt.dns.DNS_RD, dpkt.dns.DNS_RA, dpkt.dns.DNS_RCODE_NXDOMAIN)
    assert (frames.FIN, frames.SYN, frames.RST, frames.PSH, frames.ACK) == (
        dpkt.tcp.TH_FIN, dpkt.tcp.TH_SYN, dpkt.tcp.TH_RST, dpkt.tcp.TH_PUSH, dpkt.tcp.TH_ACK)
    assert (frames.PROTO_TCP, frames.PROTO_UDP) == (dpkt.ip.IP_PROTO_TCP, dpkt.ip.IP_PROTO_UDP)
    assert (tcp.OPT_NOP, tcp.OPT_MSS, tcp.OPT_WSCALE, tcp.OPT_SACK_OK, tcp.OPT_SACK, tcp.OPT_TS) == (
        dpkt.tcp.TCP_OPT_NOP, dpkt.tcp.TCP_OPT_MSS, dpkt.tcp.TCP_OPT_WSCALE, dpkt.tcp.TCP_OPT_SACKOK,
        dpkt.tcp.TCP_OPT_SACK, dpkt.tcp.TCP_OPT_TIMESTAMP)
    assert (writer.PCAP_MAGIC_US, writer.PCAP_MAGIC_NS, writer.LINKTYPE_ETHERNET) == (
        dpkt.pcap.TCPDUMP_MAGIC, dpkt.pcap.TCPDUMP_MAGIC_NANO, dpkt.pcap.DLT_EN10MB)
    assert (writer.BT_SHB, writer.BT_IDB, writer.BT_EPB, writer.BYTE_ORDER_MAGIC) == (
        dpkt.pcapng.PCAPNG_BT_SHB, dpkt.pcapng.PCAPNG_BT_IDB, dpkt.pcapng.PCAPNG_BT_EPB, dpkt.pcapng.BYTE_ORDER_MAGIC)
    assert (writer.OPT_ENDOFOPT, writer.SHB_USERAPPL, writer.IF_NAME, writer.IF_TSRESOL) == (
        dpkt.pcapng.PCAPNG_OPT_ENDOFOPT, dpkt.pcapng.PCAPNG_OPT_SHB_USERAPPL, dpkt.pcapng.PCAPNG_OPT_IF_NAME,
        dpkt.pcapng.PCAPNG_OPT_IF_TSRESOL)


def test_encoders_use_their_constants():
    """A few messages decoded by hand: the named constants are what lands on the wire."""
    from synthkit import kerberos as k, ldap as l, smb2 as s
    tgt = k.krb_principal(k.NT_SRV_INST, "krbtgt", "R")
    req = k.krb_kdc_req(k.KRB_AS_REQ, [], k.krb_req_body(k.KDC_OPT_AS, "R", tgt, 7))
    assert req[0] == 0x60 | k.KRB_AS_REQ                       # [APPLICATION 10]
    err = k.krb_error(k.KDC_ERR_PREAUTH_REQUIRED, 0, "R", k.krb_principal(k.NT_SRV_INST, "krbtgt", "R"))
    assert err[0] == 0x60 | k.KRB_ERROR and bytes((0xA6, 3, 0x02, 1, 25)) in err     # error-code [6] = 25
    assert l.ldap_bind_req("cn=x", "pw")[0] == 0x60 | l.OP_BIND_REQUEST
    assert l.LDAP_UNBIND == b"\x42\x00"
    assert l.f_eq("a", "b")[0] == 0xA3 and l.f_present("a")[0] == 0x87
    hdr = s.smb2_hdr(s.SMB2_CREATE, 5)
    assert hdr[:4] == b"\xfeSMB" and struct.unpack_from("<HH", hdr, 4)[0] == 64
    assert struct.unpack_from("<H", hdr, 12)[0] == s.SMB2_CREATE
    assert struct.unpack_from("<H", s.smb2_create_req("a", s.OPLOCK_BATCH, s.ACCESS_READ, s.FILE_OPEN, 0))[0] == 57
