"""A scan narrows a decoder's frame as soon as nothing still to be built reads its other columns
(``analyzer.narrowing``), and every frame built after it is what it would have been."""
from __future__ import annotations

from pathlib import Path

import pytest

from analyzer import open_capture
from analyzer.decoders.kerberos_ap_tokens import carrier_columns
from analyzer.decoders.smb2 import PROTOCOL as SMB2
from analyzer.narrowing import narrowing_as_built
from analyzer.narrowing import build_frames

SAMPLES = Path(__file__).parent.parent / "samples"
LDAP_FRAMES = ["ldap_messages", "ldap_transactions", "ldap_sync"]


def _record_narrowing(cap, witness: str) -> list[tuple[str, bool]]:
    """What ``cap`` narrows from now on, in order: (frame, whether ``witness`` was built by then)."""
    narrowed = []
    plain = cap.narrow_frame

    def narrow_frame(name, columns):
        narrowed.append((name, cap.built(witness)))
        plain(name, columns)
    cap.narrow_frame = narrow_frame
    return narrowed


def test_a_frame_waits_for_the_frames_of_its_protocol_that_read_it():
    with open_capture(SAMPLES / "ldap-saturation.pcap") as cap:
        narrow = narrowing_as_built(cap, LDAP_FRAMES, {"ldap_messages": {"op", "ts_last_ns"}})
        narrow()  # nothing built: nothing narrowed
        cap.frame("ldap_messages")
        wide = cap.frame("ldap_messages").columns
        narrow()  # ldap_transactions is paired from it, not built yet
        assert cap.frame("ldap_messages").columns == wide
        cap.frame("ldap_transactions"), cap.frame("ldap_sync")
        narrow()
        kept = set(cap.frame("ldap_messages").columns)
        assert kept == {"op", "ts_last_ns"} | carrier_columns("ldap_messages")
        assert len(wide) > len(kept)


def test_carrier_columns_are_what_kerberos_ap_reads_of_a_carrier():
    assert carrier_columns("ldap_messages") == {"transport", "flow", "auth", "op"}
    assert carrier_columns("smb2_messages") == {"transport", "flow", "command"}
    assert carrier_columns("dns_messages") == frozenset()


def test_kerberos_ap_built_after_its_carriers_are_narrowed_is_the_same():
    path = SAMPLES / "krb5-replay-ldap-gssapi.pcapng"
    with open_capture(path) as whole:
        expected = whole.frame("kerberos_ap")
    assert expected.filter(expected["carrier"] == "ldap").height >= 1
    with open_capture(path) as cap:
        narrow = narrowing_as_built(cap, [*LDAP_FRAMES, "kerberos_ap"], {"ldap_messages": {"dn"}})
        for name in LDAP_FRAMES:
            cap.frame(name)
        narrow()
        assert set(cap.frame("ldap_messages").columns) == {"dn", "transport", "flow", "auth", "op"}
        assert cap.frame("kerberos_ap").equals(expected)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_smb2_breaks_built_from_narrowed_messages_are_the_same(threads, monkeypatch):
    """smb2_breaks says what it reads of smb2_messages (Protocol.server_frame_columns): the messages are
    narrowed before it is built, keeping those; smb2_transactions, which it reads whole, waits."""
    monkeypatch.setenv("HERDSCOPE_THREADS", threads)
    path = SAMPLES / "smb2-break-queue.pcap"
    with open_capture(path) as whole:
        expected = whole.frame("smb2_breaks")
        wide_transactions = whole.frame("smb2_transactions").columns
    assert expected.height >= 1
    with open_capture(path) as cap:
        narrowed = _record_narrowing(cap, "smb2_breaks")
        frames = ["smb2_messages", "smb2_transactions", "smb2_breaks"]
        build_frames(cap, frames, {"smb2_messages": {"src"}, "smb2_transactions": {"client"}})
        assert cap.frame("smb2_breaks").equals(expected)
        assert set(cap.frame("smb2_messages").columns) == ({"src"} | carrier_columns("smb2_messages")
                                                           | set(SMB2.server_frame_columns["smb2_messages"]))
        assert cap.frame("smb2_transactions").columns == ["client"] != wide_transactions
    assert narrowed == [("smb2_messages", False), ("smb2_transactions", True)]


@pytest.mark.parametrize("others", [False, True])
def test_the_frames_not_asked_for_are_narrowed_once_their_protocol_is_built(others, monkeypatch):
    """With ``others`` (stats, which frees them afterwards) the frames a protocol's asked-for frames are
    built of are narrowed to what the others read of them (kerberos_ap's carrier columns) as soon as
    those are built: Kerberos's messages before LDAP is decoded. Without it they are left whole."""
    monkeypatch.setenv("HERDSCOPE_THREADS", "1")  # in the order asked
    path = SAMPLES / "krb5-replay-ldap-gssapi.pcapng"
    with open_capture(path) as whole:
        expected = {name: whole.frame(name) for name in ("kerberos_transactions", "ldap_transactions")}
        wide = {name: whole.frame(name).columns for name in ("kerberos_messages", "ldap_messages")}
    with open_capture(path) as cap:
        narrowed = _record_narrowing(cap, "ldap_messages")
        build_frames(cap, list(expected), {}, others=others)
        for name, frame in expected.items():
            assert cap.frame(name).equals(frame)
        held = {name: cap.frame(name).columns for name in wide}
    if not others:
        assert narrowed == [] and held == wide
        return
    assert narrowed[0] == ("kerberos_messages", False)  # before LDAP is decoded
    assert {name for name, _ in narrowed} == {"kerberos_messages", "ldap_messages", "ldap_sync"}
    assert held == {name: [c for c in wide[name] if c in carrier_columns(name)] for name in wide}



def test_when_built_sees_the_frame_whole_once_as_it_is_built():
    """``Capture.when_built``: the call is made once, in the building, with every column, before the
    build's narrowing; asked for a frame built already, at once."""
    seen = []
    with open_capture(SAMPLES / "ldap-saturation.pcap") as cap:
        cap.when_built("ldap_messages", lambda frame: seen.append(frame.columns))
        assert seen == []
        build_frames(cap, LDAP_FRAMES, {"ldap_messages": frozenset({"op", "ts_last_ns"})})
        narrowed = set(cap.frame("ldap_messages").columns)
        assert len(seen) == 1 and narrowed == {"op", "ts_last_ns"} | carrier_columns("ldap_messages")
        assert narrowed < set(seen[0])  # seen whole, before the narrowing
        cap.when_built("ldap_messages", lambda frame: seen.append(frame.columns))
        assert seen[1] == cap.frame("ldap_messages").columns  # built already: at once, as it is now
