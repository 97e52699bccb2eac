"""analyzer.packet_readers: what reads the wide columns of ``packets`` is built first, and every frame
built after ``packets`` is narrowed to (frame, ts_ns) is the frame built from the whole packets
(issue 13: a scan narrows ``packets`` before its decoders run)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from analyzer import open_capture
from analyzer.capture import FRAME_BUILDERS, READER_FRAMES, _load_builders
from analyzer.packet_readers import build_packet_readers, packet_readers
from detectors.base import PACKET_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
sys.path.insert(0, str(Path(__file__).parent))
from rocev2_captures import rocev2_capture  # noqa: E402

# a capture of every decoder: DNS, Kerberos with LDAP and HTTP carriers, SMB2, NFS, RoCEv2 with PFC
CAPTURES = {
    "dns": lambda: SAMPLES / "dns-ttl-herd.pcap",
    "kerberos-ldap": lambda: SAMPLES / "krb5-replay-ldap-gssapi.pcapng",
    "kerberos-http": lambda: SAMPLES / "krb5-http-replay.pcapng",
    "smb2": lambda: SAMPLES / "smb2-break-queue.pcap",
    "nfs-tcp": lambda: SAMPLES / "nfs4-delegation-recall.pcap",
    "nfs-udp": lambda: SAMPLES / "nfs3-udp-retrans.pcap",
    "rocev2-pfc": lambda: rocev2_capture("rocev2-pfc-storm"),
}


@pytest.mark.parametrize("frames, readers, payloads, udp", [
    (["smb2_transactions"], ["connections", "tcp_segments"], True, False),
    (["dns_messages"], ["connections", "tcp_segments"], True, True),
    (["rocev2_flows"], ["rocev2_packets"], False, True),
    (["pause_frames"], ["pause_frames"], False, False),
    (["tcp_client_syns"], ["tcp_client_syns"], False, False),
    (["packets", "interfaces"], [], False, False),
])
def test_what_reads_packets_for_these_frames(frames, readers, payloads, udp):
    assert packet_readers(frames) == (readers, payloads, udp)


@pytest.mark.parametrize("name", CAPTURES)
def test_every_frame_built_from_narrowed_packets_is_the_whole_packets_frame(name):
    path = CAPTURES[name]()
    _load_builders()
    names = sorted(set(FRAME_BUILDERS) - set(READER_FRAMES))
    with open_capture(path) as whole, open_capture(path) as narrowed:
        build_packet_readers(narrowed, names)
        narrowed.narrow_packets(PACKET_COLUMNS)
        assert narrowed.packets.columns == list(PACKET_COLUMNS)
        for frame in names:
            assert narrowed.frame(frame).equals(whole.frame(frame)), frame


def test_a_builder_reading_columns_narrowed_away_says_so():
    with open_capture(SAMPLES / "smb2-break-queue.pcap") as cap:
        cap.narrow_packets(PACKET_COLUMNS)
        with pytest.raises(RuntimeError, match="'tcp_segments' reads columns narrowed away"):
            cap.frame("tcp_segments")
