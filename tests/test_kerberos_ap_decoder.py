"""kerberos_ap carriers (analyzer.decoders.kerberos_ap, kerberos_ap_carriers): byte-literal SMB2
SESSION_SETUP messages (MS-SMB2 2.2.5 / 2.2.6), LDAP binds (RFC 4511 §4.2), TGS-REQs (RFC 4120
§5.4.1), their damaged variants, the joins with the carriers' own frames on real captures, the token
source registry, request_digest of kerberos_messages, and mutated carriers that must never raise."""
from __future__ import annotations

import random
import struct
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer import open_capture
from analyzer.decoders import ber
from analyzer.decoders import kerberos as krb
from analyzer.decoders import kerberos_ap as ka
from analyzer.decoders import kerberos_ap_carriers as K
from builders import ctx, integer, kdc_req, octets, pa, seq, ticket, tlv
from fakes import message_set
from fuzzing import GSSAPI_SPECIAL, mutate
from test_gssapi import AP_REP, KRB5, NTLMSSP, ap_req, framed, neg_init, neg_resp

REVIEW = Path(__file__).parent / "data" / "review"  # reviewed captures outside the ordinary corpus
CORPUS = Path(__file__).parent / "data" / "corpus"
MORE_PROCESSING = 0xC0000016
LOGON_FAILURE = 0xC000006D


def smb2_header(command=1, response=False, status=0, next_command=0, message_id=1) -> bytes:
    flags = 1 if response else 0
    return (b"\xfeSMB" + struct.pack("<HHIHHII", 64, 1, status, command, 1, flags, next_command)
            + struct.pack("<QIIQ", message_id, 0, 0, 0x1234) + b"\x00" * 16)


def session_setup_request(token: bytes, offset=None, length=None) -> bytes:
    offset = 64 + 24 if offset is None else offset
    body = struct.pack("<HBBIIHHQ", 25, 0, 1, 1, 0, offset, len(token) if length is None else length, 0)
    return smb2_header() + body + token


def session_setup_response(token: bytes, status=0, offset=None) -> bytes:
    body = struct.pack("<HHHH", 9, 0, 64 + 8 if offset is None else offset, len(token))
    return smb2_header(response=True, status=status) + body + token


def smb2_error_response(status=LOGON_FAILURE) -> bytes:
    return smb2_header(response=True, status=status) + struct.pack("<HBBI", 9, 0, 0, 0) + b"\x00"


def rows(carrier, kernel, messages, **kw) -> pl.DataFrame:
    ms = message_set(list(messages), transport="tcp", **kw)
    return ka.decode_tokens(carrier, ka._token_sets([ms], kernel))


def smb2(*messages, **kw):
    return rows("smb2", K.smb2_tokens, messages, dport=445, **kw)


SPNEGO_AP_REQ = neg_init(framed(KRB5, b"\x01\x00", ap_req()))
SPNEGO_AP_REP = neg_resp(framed(KRB5, b"\x02\x00", AP_REP))


# --- SMB2 ------------------------------------------------------------------------------------------------

def test_smb2_session_setup_request_and_response():
    out = smb2(session_setup_request(SPNEGO_AP_REQ), session_setup_response(SPNEGO_AP_REP, status=0),
               session_setup_response(SPNEGO_AP_REP, status=MORE_PROCESSING), frames=[5, 6, 7],
               from_client=[True, False, False])
    assert out.select("carrier", "frame", "message", "from_client", "decode_error").rows() == [
        ("smb2", 5, "ap_req", True, None), ("smb2", 6, "ap_rep", False, None), ("smb2", 7, "ap_rep", False, None)]
    assert out["sname"][0] == "cifs/fs.example.com" and out["sport"][0] == 50000 and out["dport"][0] == 445


def test_smb2_without_kerberos_gives_no_row():
    negotiate = smb2_header(command=0) + b"\x24\x00" + b"\x00" * 34
    out = smb2(session_setup_request(NTLMSSP), session_setup_request(neg_init(NTLMSSP)), smb2_error_response(),
               session_setup_request(b""), negotiate, b"\xffSMB" + b"\x00" * 60, b"garbage")
    assert out.height == 0


def test_smb2_compound_second_element():
    first = smb2_header(command=0, next_command=72) + b"\x00" * 8  # a (bogus-bodied) NEGOTIATE, then SESSION_SETUP
    out = smb2(first + session_setup_request(SPNEGO_AP_REQ, offset=88))
    assert out["message"].to_list() == ["ap_req"]


def test_smb2_buffer_past_the_message():
    req = session_setup_request(SPNEGO_AP_REQ)
    cut = req[:-30]
    truncated = smb2(cut, wire_lengths=[len(req)])  # the snapshot length cut it
    assert truncated["decode_error"].to_list() == ["truncated"]
    lying = smb2(session_setup_request(SPNEGO_AP_REQ, length=len(SPNEGO_AP_REQ) + 500))
    assert lying["decode_error"].to_list() == ["bad length"]  # past the message on the wire too
    into_header = smb2(session_setup_request(SPNEGO_AP_REQ, offset=40))
    assert into_header["decode_error"].to_list() == ["bad length"]
    short_body = smb2(smb2_header() + b"\x19\x00\x00")
    assert short_body.height == 0  # no buffer position to read: the SMB2 decoder counts that message


# --- LDAP ------------------------------------------------------------------------------------------------

def bind_request(mech: str, creds: bytes | None, msgid=1) -> bytes:
    sasl = ctx(3, octets(mech), *([octets(creds)] if creds is not None else []))
    return seq(integer(msgid), tlv(0x60, integer(3), octets(""), sasl))


def bind_response(creds: bytes | None, code=14, msgid=1, referral=False) -> bytes:
    parts = [tlv(0x0A, bytes([code])), octets(""), octets("")]
    if referral:
        parts.append(ctx(3, octets("ldap://other/")))
    if creds is not None:
        parts.append(tlv(0x87, creds))
    return seq(integer(msgid), tlv(0x61, *parts))


def ldap(*messages, **kw):
    return rows("ldap", K.ldap_tokens, messages, dport=389, **kw)


def test_ldap_gssapi_and_gss_spnego_binds():
    gssapi = framed(KRB5, b"\x01\x00", ap_req())
    out = ldap(bind_request("GSSAPI", gssapi), bind_response(framed(KRB5, b"\x02\x00", AP_REP)),
               bind_request("GSS-SPNEGO", SPNEGO_AP_REQ, msgid=2), bind_response(SPNEGO_AP_REP, code=0, msgid=2,
                                                                                   referral=True),
               from_client=[True, False, True, False])
    assert out.select("carrier", "message", "spnego", "from_client").rows() == [
        ("ldap", "ap_req", False, True), ("ldap", "ap_rep", False, False),
        ("ldap", "ap_req", True, True), ("ldap", "ap_rep", True, False)]
    assert out["decode_error"].null_count() == 4


def test_ldap_without_tokens_gives_no_row():
    simple = seq(integer(1), tlv(0x60, integer(3), octets("cn=a"), tlv(0x80, b"secret")))
    search = seq(integer(2), tlv(0x63, octets("dc=x")))
    out = ldap(simple, bind_request("GSSAPI", None), bind_request("GSSAPI", b""), bind_response(None, code=49),
               search, bind_request("GSS-SPNEGO", neg_init(NTLMSSP)), b"\x00\x00\x00\x10" + b"x" * 16)
    assert out.height == 0


def test_ldap_truncated_credentials():
    full = bind_request("GSSAPI", framed(KRB5, b"\x01\x00", ap_req()))
    out = ldap(full[:-20], wire_lengths=[len(full)])
    assert out["decode_error"].to_list() == ["truncated"] and out["message"].to_list() == ["ap_req"]


# --- KDC -------------------------------------------------------------------------------------------------

def kdc(*messages, **kw):
    return rows("kdc", K.kdc_tokens, messages, dport=88, **kw)


def test_pa_tgs_req_ap_req():
    tgt = ticket("EXAMPLE.COM", ("krbtgt", "EXAMPLE.COM"), etype=18, kvno=1)
    apreq = tlv(0x6E, seq(ctx(0, integer(5)), ctx(1, integer(14)), ctx(2, tlv(0x03, b"\x00\x00\x00\x00\x00")),
                          ctx(3, tgt), ctx(4, seq(ctx(0, integer(18)), ctx(2, octets(b"z" * 30 + b"TAG-12bytes!"))))))
    tgs = kdc_req(12, padata=[pa(128, b"\x30\x00"), pa(1, apreq)], cname=None, sname=("HTTP", "web"))
    out = kdc(tgs, kdc_req(10), kdc_req(12, padata=[pa(2, b"")]))
    assert out.height == 1
    r = out.row(0, named=True)
    assert (r["carrier"], r["message"], r["mech"], r["realm"], r["sname"], r["ticket_kvno"]) == \
        ("kdc", "ap_req", None, "EXAMPLE.COM", "krbtgt/EXAMPLE.COM", 1)
    assert r["rc_tag"] == b"TAG-12bytes!" and r["ap_options"] == 0


# --- on real captures: the joins R uses -------------------------------------------------------------------

def test_frames_join_their_carriers():
    checked = set()
    for name in ("zeek/krb/smb2_krb.pcap", "suricata-verify/smb2-09-trunc-file-logging/input.pcap",
                 "zeek/ldap/missing_ldap_logs.pcapng", "zeek/krb/kinit.pcap"):
        with open_capture((REVIEW if name.startswith("suricata-verify/smb2-09") else CORPUS) / name) as cap:
            ap = cap.frame("kerberos_ap")
            carriers = {
                "smb2": cap.frame("smb2_messages").filter(pl.col("command") == "SESSION_SETUP"),
                "ldap": cap.frame("ldap_messages").filter(pl.col("op").is_in(["bindRequest", "bindResponse"])),
                "kdc": cap.frame("kerberos_messages").filter(pl.col("message") == "TGS-REQ"),
            }
            for carrier, frame in carriers.items():
                mine = ap.filter(pl.col("carrier") == carrier)
                if mine.height == 0:
                    continue
                checked.add(carrier)
                joined = mine.join(frame.select("frame_first", "frame_last", "flow", "from_client").unique(),
                                   left_on=["frame", "frame_last", "flow", "from_client"],
                                   right_on=["frame_first", "frame_last", "flow", "from_client"], how="anti")
                assert joined.height == 0, (name, carrier, joined)
    assert checked == {"smb2", "ldap", "kdc"}


def test_schema_of_the_frame():
    with open_capture(CORPUS / "zeek/krb/smb2_krb.pcap") as cap:
        ap = cap.frame("kerberos_ap")
    assert ap.columns == [c.name for c in ka.COLUMNS]
    assert ap.schema["carrier"] == ka.CARRIER_ENUM and ap.schema["rc_tag"] == pl.Binary
    assert ap.schema["ts_ns"] == pl.Int64 and ap.schema["frame"] == pl.UInt32
    empty = ka.decode_tokens("smb2", [])
    assert empty.height == 0 and empty.columns == ap.columns


def test_token_sources(monkeypatch):
    with pytest.raises(ValueError):
        ka.register_token_source("ftp", lambda cap: [])
    with pytest.raises(ValueError):
        ka.decode_tokens("ftp", [])
    fake = message_set([framed(KRB5, b"\x01\x00", ap_req())], transport="tcp", frames=[999], dport=8080)
    monkeypatch.setitem(ka._SOURCES, "http", lambda cap: [fake])
    with open_capture(CORPUS / "zeek/krb/smb2_krb.pcap") as cap:
        ap = cap.frame("kerberos_ap")
    assert ap.filter(pl.col("carrier") == "http")["frame"].to_list() == [999]
    assert ap.filter(pl.col("carrier") == "smb2").height == 2
    assert set(ka.token_sources()) >= {"kdc", "smb2", "ldap", "http"}


# --- request_digest ----------------------------------------------------------------------------------------

def _fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def test_request_digest():
    a, b = kdc_req(12, nonce=1), kdc_req(12, nonce=2)
    out = krb.decode_messages([message_set([a, a, b, b"\x00"])])
    d = out["request_digest"].to_list()
    assert d[0] == d[1] != d[2] and d[0] == _fnv1a(a) and d[3] == _fnv1a(b"\x00")
    assert out.schema["request_digest"] == pl.UInt64


# --- hostile carriers --------------------------------------------------------------------------------------

SAMPLES = {
    "smb2": [session_setup_request(SPNEGO_AP_REQ), session_setup_response(SPNEGO_AP_REP, status=MORE_PROCESSING)],
    "ldap": [bind_request("GSSAPI", framed(KRB5, b"\x01\x00", ap_req())), bind_response(SPNEGO_AP_REP)],
    "kdc": [kdc_req(12, padata=[pa(1, ap_req())])],
}
KERNELS = {"smb2": K.smb2_tokens, "ldap": K.ldap_tokens, "kdc": K.kdc_tokens}


def _mutate(data: bytes, rnd: random.Random) -> bytes:
    return mutate(data, rnd, GSSAPI_SPECIAL)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.sampled_from(sorted(SAMPLES)))
def test_mutated_carriers_never_raise(seed, carrier):
    rnd = random.Random(seed)
    messages = [_mutate(rnd.choice(SAMPLES[carrier]), rnd) for _ in range(6)]
    wires = [len(m) + rnd.choice([0, 0, 7, 1000]) for m in messages]
    out = rows(carrier, KERNELS[carrier], messages, wire_lengths=wires)
    assert set(out["decode_error"].drop_nulls()) <= set(ber.STATUS_NAMES.values())
    assert out.height <= 6 * (4 if carrier == "smb2" else 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=6), st.sampled_from(sorted(SAMPLES)))
def test_random_carriers_never_raise(messages, carrier):
    out = rows(carrier, KERNELS[carrier], messages)
    assert out.height <= len(messages) * (4 if carrier == "smb2" else 1)


def test_remembered_tokens_are_the_framed_again_tokens(monkeypatch):
    """A carrier's tokens kept when its decoder built its messages frame (kerberos_ap_tokens) give the
    frame that framing the carrier's connections again gives, compacted to the tokens' bytes."""
    from analyzer.decoders import kerberos_ap_tokens
    paths = [CORPUS / "zeek/krb/smb2_krb.pcap", CORPUS / "zeek/krb/kerberos_tso.pcapng",
             REVIEW / "suricata-verify/smb2-09-trunc-file-logging/input.pcap"]
    kept = []
    for path in paths:
        with open_capture(path) as cap:
            kept.append(cap.frame("kerberos_ap"))
            assert kerberos_ap_tokens.remembered(cap, "smb2_messages")  # the SESSION_SETUP tokens were kept
    monkeypatch.setattr(kerberos_ap_tokens, "keep", lambda *args: None)  # what remember calls too
    for path, want in zip(paths, kept):
        with open_capture(path) as cap:
            again = cap.frame("kerberos_ap")
            assert kerberos_ap_tokens.remembered(cap, "smb2_messages") is None
        assert again.filter(pl.col("carrier") == "smb2").height > 0 and again.equals(want), path


def _tokens(sets) -> list[tuple]:
    """Token sets' rows (but the offset into their set's buffer) with each token's bytes."""
    return [(*row[:-2], bytes(ms.buf[row[-2]:row[-2] + row[-1]])) for ms in sets or ()
            for row in ms.frame.select(pl.exclude("offset", "length"), "offset", "length").iter_rows()]


def _decoded_at_once(carrier: str, cap) -> tuple[list, dict[str, pl.DataFrame]]:
    """A carrier's message sets framed at once, and the frames its builder makes of them."""
    from analyzer.decoders import ldap, ldap_sync, smb2
    if carrier == "smb2":
        sets = smb2.message_sets(cap)
        return sets, {"smb2_messages": smb2.decode_messages(sets)}
    sets = [ms for ms in ldap.message_sets(cap) if ms.height]
    return sets, {"ldap_messages": ldap.decode_messages(sets), "ldap_sync": ldap_sync.decode_sync(sets)}


_SAMPLES = Path(__file__).parent.parent / "samples"
# per carrier: captures (each a list of files read as one), and the fewest batches of one connection
# the one-byte batches must reach on one of them
BATCHED = {
    "smb2": ([[CORPUS / "zeek/krb/smb2_krb.pcap"], [REVIEW / "suricata-verify/smb2-09-trunc-file-logging/input.pcap"],
              [_SAMPLES / "smb2-break-queue.pcap"], [_SAMPLES / "smb2-toctou.pcap"]], 5),
    "ldap": ([[_SAMPLES / "krb5-replay-ldap-gssapi.pcapng"], [_SAMPLES / "eval" / "ldap-saturation-writes.pcap"],
              # CLDAP datagrams and LDAP connections in one capture: the datagrams come with the first batch
              [CORPUS / "suricata-verify/bug-8619/cldap-leak.pcap", _SAMPLES / "ldap-repl-conflict.pcap"]], 20),
}


@pytest.mark.parametrize("batch_bytes", [1, 5_000, 1 << 40])
@pytest.mark.parametrize("carrier", sorted(BATCHED))
def test_a_carrier_decoded_in_batches_is_decoded_at_once(monkeypatch, carrier, batch_bytes):
    """A carrier's messages frame (and ldap_sync, built with LDAP's), and the tokens kerberos_ap reads of
    it (SMB2 SESSION_SETUP, LDAP GSSAPI binds), are the same whether it is framed a batch of
    ``batch_bytes`` of payload at a time (down to one connection per batch) or at once."""
    import importlib

    from analyzer import open_captures
    from analyzer.decoders import kerberos_ap_tokens
    from analyzer.tcp import connection_batches
    module = importlib.import_module(f"analyzer.decoders.{carrier}")
    monkeypatch.setattr(module, "FRAMING_BATCH_BYTES", batch_bytes)
    captures, fewest = BATCHED[carrier]
    messages = f"{carrier}_messages"
    most = 0  # connections of a capture decoded one per batch
    for paths in captures:
        with open_captures(paths) as cap:
            sets, want = _decoded_at_once(carrier, cap)
            want_tokens = kerberos_ap_tokens.carried(messages, sets, want[messages])
            batches = connection_batches(cap, set(module.PROTOCOL.tcp_ports), batch_bytes)
            for name, frame in want.items():
                assert cap.frame(name).equals(frame), (name, paths)
            got_tokens = kerberos_ap_tokens.remembered(cap, messages)
            assert _tokens(got_tokens) == _tokens(want_tokens), paths  # each batch's buffer its own: offsets differ
            ap = cap.frame("kerberos_ap")
        assert want[messages].height
        assert "ldap-saturation-writes" not in str(paths[0]) or want["ldap_sync"].height  # syncrepl in it
        if len(paths) > 1:
            assert set(want[messages]["transport"].cast(pl.String)) == {"udp", "tcp"}
        if batch_bytes == 1:  # one connection a batch (one with payload may carry no message)
            assert len(batches) >= want[messages].filter(pl.col("transport") == "tcp")["flow"].n_unique()
            assert all(len(b) == 1 for b in batches[1:])
            most = max(most, len(batches))
        monkeypatch.setattr(kerberos_ap_tokens, "keep", lambda *args: None)  # framed again: the same tokens
        with open_captures(paths) as cap:
            assert cap.frame("kerberos_ap").equals(ap), paths
        monkeypatch.undo()
        monkeypatch.setattr(module, "FRAMING_BATCH_BYTES", batch_bytes)
    assert batch_bytes != 1 or most > fewest
