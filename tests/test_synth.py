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
