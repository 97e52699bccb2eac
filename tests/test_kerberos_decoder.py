"""Kerberos decoder (analyzer.decoders.kerberos): byte-literal messages (RFC 4120 §5), malformed
variants, random input, and the transaction pairing on small constructed message sets."""
from __future__ import annotations

import random

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer.decoders import kerberos as krb
from builders import ap_req, ctx, enc_data, integer, kdc_rep, kdc_req, krb_error, octets, pa, seq, ticket, tlv
from fakes import message_set
from fuzzing import BER_SPECIAL, mutate


def decode(*messages: bytes, **kw) -> pl.DataFrame:
    return krb.decode_messages([message_set(list(messages), **kw)])


def row(message: bytes) -> dict:
    out = decode(message)
    assert out.height == 1
    return out.row(0, named=True)


# --- messages -----------------------------------------------------------------------------------------

def test_as_req_every_field():
    m = kdc_req(10, padata=[pa(2, enc_data(23, None, b"ts")), pa(128, seq(ctx(0, tlv(0x01, b"\xff"))))],
                nonce=0xFFFFFFFF, etypes=(18, 17, 23, -135))
    r = row(m)
    assert r["message"] == "AS-REQ" and r["msg_type"] == 10 and r["pvno"] == 5
    assert (r["realm"], r["cname"], r["sname"]) == ("EXAMPLE.COM", "alice", "krbtgt/EXAMPLE.COM")
    assert r["crealm"] is None
    assert r["nonce"] == 0xFFFFFFFF  # UInt32 with the top bit set: 5 octets with a sign octet
    assert r["etypes"] == "18,17,23,-135"
    assert r["padata_types"] == "2,128"
    assert r["preauth"] is True and r["preauth_etype"] == 23
    assert r["kdc_options"] == 0x40810010
    assert r["till_ns"] == 2136422885 * 10**9
    assert r["decode_error"] is None
    assert r["transport"] == "udp" and r["frame_last"] == 1  # message-set columns carried over


def test_as_req_without_preauth():
    r = row(kdc_req(10, padata=[pa(128)]))
    assert r["preauth"] is False and r["preauth_etype"] is None and r["padata_types"] == "128"
    r = row(kdc_req(10))
    assert r["padata_types"] is None and r["preauth"] is False


@pytest.mark.parametrize("ptype", [2, 14, 16, 136, 138])
def test_preauth_padata_types(ptype):
    value = enc_data(18) if ptype == 2 else b"\x30\x00"
    assert row(kdc_req(10, padata=[pa(ptype, value)]))["preauth"] is True


def test_tgs_req_with_pa_tgs_req():
    tgt = ticket("EXAMPLE.COM", ("krbtgt", "EXAMPLE.COM"), etype=18, kvno=7)
    m = kdc_req(12, padata=[pa(1, ap_req(tgt)), pa(167)], cname=None, sname=("cifs", "fs1.example.com"))
    r = row(m)
    assert r["message"] == "TGS-REQ" and r["msg_type"] == 12
    assert r["cname"] is None and r["sname"] == "cifs/fs1.example.com" and r["realm"] == "EXAMPLE.COM"
    assert (r["tgs_ticket_realm"], r["tgs_ticket_sname"]) == ("EXAMPLE.COM", "krbtgt/EXAMPLE.COM")
    assert (r["ticket_etype"], r["ticket_kvno"]) == (18, 7)
    assert r["padata_types"] == "1,167"  # one contiguous text even though the AP-REQ wrote strings too
    assert r["preauth"] is False
    assert r["enc_etype"] is None  # the authenticator of a nested AP-REQ is not the message's enc-part


def test_as_rep():
    tkt = ticket("EXAMPLE.COM", ("krbtgt", "EXAMPLE.COM"), etype=23, kvno=2)
    r = row(kdc_rep(11, tkt=tkt, padata=[pa(19, b"\x30\x00")], cname=("Alice",)))
    assert r["message"] == "AS-REP" and r["msg_type"] == 11
    assert (r["crealm"], r["cname"]) == ("EXAMPLE.COM", "Alice")
    assert (r["realm"], r["sname"]) == ("EXAMPLE.COM", "krbtgt/EXAMPLE.COM")  # the issued ticket's
    assert (r["ticket_etype"], r["ticket_kvno"]) == (23, 2)
    assert (r["enc_etype"], r["enc_kvno"]) == (18, 3)
    assert r["padata_types"] == "19"
    assert r["nonce"] is None and r["preauth"] is None  # the reply nonce is encrypted (§5.4.2)


def test_tgs_rep_kvno_optional():
    r = row(kdc_rep(13, enc_kvno=None))
    assert r["message"] == "TGS-REP" and r["enc_etype"] == 18 and r["enc_kvno"] is None


def test_krb_error_every_field():
    e_data = seq(pa(136), pa(19, b"\x30\x00"), pa(2), pa(133, b"MIT"))
    m = krb_error(25, e_text="NEEDED_PREAUTH", e_data=e_data, ctime="19900811142417Z", cusec=5)
    r = row(m)
    assert r["message"] == "KRB-ERROR" and r["msg_type"] == 30
    assert r["error_code"] == 25 and r["error_name"] == "KDC_ERR_PREAUTH_REQUIRED"
    assert r["e_text"] == "NEEDED_PREAUTH"
    assert r["stime_ns"] == 1421708049 * 10**9 + 334091 * 1000
    assert r["ctime_ns"] == 650384657 * 10**9 + 5000
    assert (r["crealm"], r["cname"], r["realm"], r["sname"]) == ("EXAMPLE.COM", "alice", "EXAMPLE.COM",
                                                                 "krbtgt/EXAMPLE.COM")
    assert r["padata_types"] == "136,19,2,133"  # METHOD-DATA in e-data
    assert r["preauth"] is None  # a request property
    assert r["decode_error"] is None


@pytest.mark.parametrize("code,name", [(6, "KDC_ERR_C_PRINCIPAL_UNKNOWN"), (24, "KDC_ERR_PREAUTH_FAILED"),
                                       (37, "KRB_AP_ERR_SKEW"), (52, "KRB_ERR_RESPONSE_TOO_BIG"),
                                       (68, "KDC_ERR_WRONG_REALM"), (4242, "KRB_ERROR_4242")])
def test_krb_error_names(code, name):
    assert row(krb_error(code))["error_name"] == name


def test_krb_error_e_data_not_method_data():
    # TYPED-DATA (MS-KILE 2.2.1: KERB-ERROR-DATA) or anything else: no padata, no error
    typed = seq(seq(ctx(0, integer(3)), ctx(1, octets(b"\x00" * 12))))
    r = row(krb_error(12, e_data=typed))
    assert r["padata_types"] is None and r["decode_error"] is None
    r = row(krb_error(12, e_data=b"\x00\x01garbage"))
    assert r["padata_types"] is None and r["decode_error"] is None


def test_krb_error_optional_fields_absent():
    r = row(krb_error(7, cname=None, crealm=None))
    assert r["cname"] is None and r["crealm"] is None and r["e_text"] is None and r["ctime_ns"] is None


def test_ap_req_and_others():
    r = row(ap_req(ticket("EXAMPLE.COM", ("HTTP", "web.example.com"), etype=23, kvno=4), auth_etype=17))
    assert r["message"] == "AP-REQ" and r["msg_type"] == 14
    assert (r["realm"], r["sname"], r["ticket_etype"], r["ticket_kvno"]) == ("EXAMPLE.COM", "HTTP/web.example.com", 23, 4)
    assert r["enc_etype"] == 17 and r["tgs_ticket_sname"] is None
    ap_rep = tlv(0x6F, seq(ctx(0, integer(5)), ctx(1, integer(15)), ctx(2, enc_data(18))))
    r = row(ap_rep)
    assert (r["message"], r["msg_type"], r["pvno"], r["decode_error"]) == ("AP-REP", 15, 5, None)
    krb_priv = tlv(0x75, seq(ctx(0, integer(5)), ctx(1, integer(21)), ctx(3, enc_data(18))))
    assert row(krb_priv)["message"] == "KRB-PRIV"


def test_utf8_and_unprintable_names():
    r = row(kdc_req(10, cname=("jürgen", b"a\x01b", "x\\y"), realm="ÉXAMPLE"))
    assert r["cname"] == "jürgen/a\\x01b/x\\x5cy" and r["realm"] == "ÉXAMPLE"


def test_empty_and_one_component_names():
    assert row(kdc_req(10, cname=()))["cname"] == ""
    assert row(kdc_req(10, sname=("krbtgt",)))["sname"] == "krbtgt"


# --- malformed ----------------------------------------------------------------------------------------

def test_truncated_message_keeps_what_was_captured():
    m = kdc_req(10, padata=[pa(128)])
    cut = m[: len(m) - 20]  # the etype list and nonce are cut off
    out = decode(cut, wire_lengths=[len(m)])
    r = out.row(0, named=True)
    assert r["decode_error"] == "truncated" and r["message"] == "AS-REQ"
    assert r["pvno"] == 5 and r["padata_types"] == "128" and r["realm"] == "EXAMPLE.COM"
    assert r["complete"] is False


@pytest.mark.parametrize("data,reason", [
    (b"", "truncated"),
    (b"\x6a", "truncated"),
    (b"\x6a\x80\x30\x00\x00\x00", "indefinite length"),
    (b"\x30\x03\x02\x01\x05", "not this protocol"),  # a universal SEQUENCE, not [APPLICATION n]
    (b"\x63\x02\x30\x00", "not this protocol"),  # [APPLICATION 3]: no Kerberos message
    (b"\x4a\x00", "not this protocol"),  # primitive application tag
    (b"\x6a\x02\x04\x00", "unexpected tag"),  # the application content must be a SEQUENCE
    (tlv(0x6A, seq(ctx(1, integer(5)), ctx(2, integer(10)))), "missing field"),  # no req-body
    (tlv(0x7E, seq(ctx(0, integer(5)), ctx(1, integer(30)))), "missing field"),  # no error-code
    (tlv(0x6A, seq(ctx(1, integer(5)), ctx(2, octets("x")))), "unexpected tag"),
    (tlv(0x6A, seq(ctx(1, tlv(0x02, b"")))), "bad integer"),
    (tlv(0x6A, seq(ctx(1, tlv(0x02, b"\x01" * 10)))), "bad integer"),
    (bytes.fromhex("6a0630030202ffff"), "bad length"),  # INTEGER past the SEQUENCE, inside the message
    (bytes.fromhex("6a0530030202ff"), "truncated"),  # INTEGER past the end of the message
    (bytes.fromhex("6a853000000000"), "bad length"),  # 5 length octets
    (kdc_req(10) + b"\x00", "trailing bytes"),
    (kdc_req(10, msg_type=12), "bad value"),  # msg-type disagrees with the application tag
])
def test_malformed(data, reason):
    r = row(data)
    assert r["decode_error"] == reason


def test_malformed_values_inside_padata():
    bad_ts = kdc_req(10, padata=[pa(2, b"\x04\x00")])  # PA-ENC-TIMESTAMP not EncryptedData
    r = row(bad_ts)
    assert r["decode_error"] == "unexpected tag" and r["nonce"] == 12345  # the rest still decoded
    bad_ap = kdc_req(12, padata=[pa(1, b"\x6e\x03\x30\x01")], cname=None)
    r = row(bad_ap)
    assert r["decode_error"] in ("truncated", "bad length") and r["sname"] == "krbtgt/EXAMPLE.COM"


def test_bogus_lengths_do_not_read_outside():
    # principal whose name-string claims 0x7fffffff bytes
    bogus = bytes.fromhex("6a84000000183084000000101a0e3084000000083084ffffffff1b00")
    assert row(bogus)["decode_error"] in ("truncated", "bad length", "unexpected tag")


def test_long_escaped_names_grow_the_arena():
    big = bytes(range(1, 32)) * 200  # every byte escaped to 4: more than the first arena
    out = decode(*[kdc_req(10, cname=(big,)) for _ in range(3)])
    assert out["cname"].str.len_bytes().to_list() == [len(big) * 4] * 3


def test_several_sets_and_empty():
    a = message_set([kdc_req(10)])
    b = message_set([kdc_rep(11)], transport="tcp")
    out = krb.decode_messages([a, b])
    assert out["message"].to_list() == ["AS-REQ", "AS-REP"]
    assert out["transport"].to_list() == ["udp", "tcp"]
    empty = krb.decode_messages([])
    assert empty.height == 0 and empty.columns == [c.name for c in krb.MESSAGE_COLUMNS]


def test_schema_matches_columns():
    out = decode(kdc_req(10))
    assert out.columns == [c.name for c in krb.MESSAGE_COLUMNS]
    for c in krb.MESSAGE_COLUMNS:
        assert c.description


# --- random input: never raises, one row per message -------------------------------------------------

SAMPLES = [kdc_req(10, padata=[pa(2, enc_data(18)), pa(128)]),
           kdc_req(12, padata=[pa(1, ap_req(ticket("R", ("krbtgt", "R"))))], cname=None),
           kdc_rep(11), kdc_rep(13), krb_error(25, e_text="x", e_data=seq(pa(2), pa(19))),
           ap_req(ticket("R", ("a", "b")))]


def _mutate(data: bytes, rnd: random.Random) -> bytes:
    return mutate(data, rnd, BER_SPECIAL)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=120), min_size=1, max_size=8))
def test_random_bytes_never_raise(messages):
    out = decode(*messages)
    assert out.height == len(messages)
    assert set(out["decode_error"].drop_nulls()) <= set(krb.ber.STATUS_NAMES.values())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
def test_mutated_messages_never_raise(seed):
    rnd = random.Random(seed)
    messages = [_mutate(rnd.choice(SAMPLES), rnd) for _ in range(6)]
    out = decode(*messages)
    assert out.height == len(messages)
    assert out["frame_last"].to_list() == list(range(1, 7))


# --- transactions ---------------------------------------------------------------------------------------

def tx_of(sets) -> pl.DataFrame:
    return krb.pair_transactions(krb.decode_messages(sets))


S = 1_000_000_000


def test_pairing_by_flow_and_order():
    msgs = [kdc_req(10, nonce=1), kdc_req(10, nonce=2), kdc_rep(11), kdc_rep(11)]
    s = message_set(msgs, flows=[0, 1, 1, 0], from_client=[True, True, False, False],
                    ts=[1 * S, 2 * S, 3 * S, 5 * S])
    tx = tx_of([s])
    assert tx["nonce"].to_list() == [1, 2]
    assert tx["response_frame"].to_list() == [4, 3]
    assert tx["latency_ns"].to_list() == [4 * S, 1 * S]
    assert tx["status"].to_list() == ["AS-REP", "AS-REP"]
    assert tx["is_error"].to_list() == [False, False] and tx["answered"].to_list() == [True, True]
    assert tx.columns[:17] == [c.name for c in krb.TRANSACTION_COLUMNS][:17]
    assert tx["protocol"].to_list() == ["kerberos"] * 2 and tx["operation"].to_list() == ["AS-REQ"] * 2
    assert tx["resource"].to_list() == ["alice@EXAMPLE.COM"] * 2


def test_error_pairs_with_latest_unanswered_request():
    msgs = [kdc_req(12, nonce=1, cname=None), kdc_req(12, nonce=2, cname=None, sname=("host", "a")),
            kdc_rep(13), krb_error(7, sname=("host", "a"))]
    s = message_set(msgs, flows=[0, 0, 0, 0], from_client=[True, True, False, False], ts=[1 * S, 2 * S, 3 * S, 4 * S])
    tx = tx_of([s])
    # the TGS-REP takes the latest TGS-REQ (nonce 2); the error the latest unanswered one (nonce 1)
    assert tx.select("nonce", "response_frame", "status").rows() == [
        (1, 4, "KDC_ERR_S_PRINCIPAL_UNKNOWN"), (2, 3, "TGS-REP")]
    assert tx["resource"].to_list() == ["krbtgt/EXAMPLE.COM@EXAMPLE.COM", "host/a@EXAMPLE.COM"]


def test_reply_kind_must_match():
    msgs = [kdc_req(10, nonce=1), kdc_rep(13)]
    tx = tx_of([message_set(msgs, from_client=[True, False])])
    assert tx["answered"].to_list() == [False]  # a TGS-REP does not answer an AS-REQ


def test_unanswered_duplicate_and_retransmission():
    # a UDP retry (same nonce) answered twice, then once more: each error takes the latest request
    # still unanswered before it (the retry, then the first copy); the third is an extra response
    msgs = [kdc_req(10, nonce=9), kdc_req(10, nonce=9), krb_error(6), krb_error(6), krb_error(6),
            kdc_req(10, nonce=3)]
    s = message_set(msgs, flows=[0, 0, 0, 0, 0, 1], from_client=[True, True, False, False, False, True])
    tx = tx_of([s])
    assert tx.select("nonce", "retransmission", "response_frame", "extra_responses").rows() == [
        (9, False, 4, 0), (9, True, 3, 1), (3, False, None, 0)]
    assert tx["status"].to_list() == ["KDC_ERR_C_PRINCIPAL_UNKNOWN", "KDC_ERR_C_PRINCIPAL_UNKNOWN", None]
    assert tx["is_error"].to_list() == [True, True, False]
    assert tx["answered"].to_list() == [True, True, False]


def _preauth_dance(second_padata, second_reply, gap=1 * S):
    """AS-REQ (no pre-auth) -> PREAUTH_REQUIRED on flow 0; AS-REQ on flow 1 (a new client port)."""
    msgs = [kdc_req(10, nonce=1, padata=[pa(128)]), krb_error(25, e_data=seq(pa(2), pa(19))),
            kdc_req(10, nonce=2, padata=second_padata), second_reply]
    return message_set(msgs, flows=[0, 0, 1, 1], from_client=[True, False, True, False],
                       ts=[1 * S, 1 * S + 1000, 1 * S + 1000 + gap, 2 * S + gap])


def test_preauth_dance_is_one_login():
    tx = tx_of([_preauth_dance([pa(2, enc_data(18)), pa(128)], kdc_rep(11))])
    assert tx.select("login", "login_step", "status", "is_error", "login_status").rows() == [
        (0, 1, "KDC_ERR_PREAUTH_REQUIRED", False, "AS-REP"),
        (0, 2, "AS-REP", False, "AS-REP")]


def test_preauth_dance_with_wrong_password():
    tx = tx_of([_preauth_dance([pa(2, enc_data(18))], krb_error(24))])
    assert tx.select("login", "login_step", "is_error", "login_status").rows() == [
        (0, 1, False, "KDC_ERR_PREAUTH_FAILED"), (0, 2, True, "KDC_ERR_PREAUTH_FAILED")]


def test_preauth_required_without_follow_up_is_an_error():
    msgs = [kdc_req(10, nonce=1), krb_error(25)]
    tx = tx_of([message_set(msgs, from_client=[True, False])])
    assert tx.select("login_step", "is_error", "login_status").rows() == [(1, True, "KDC_ERR_PREAUTH_REQUIRED")]


def test_follow_up_must_carry_preauth_and_come_soon():
    tx = tx_of([_preauth_dance([pa(128)], kdc_rep(11))])  # retry without pre-auth: not the dance
    assert tx["login"].to_list() == [0, 1] and tx["is_error"].to_list() == [True, False]
    tx = tx_of([_preauth_dance([pa(2, enc_data(18))], kdc_rep(11), gap=60 * S)])  # past the window
    assert tx["login"].to_list() == [0, 1]
    tx = krb.pair_transactions(krb.decode_messages([_preauth_dance([pa(2, enc_data(18))], kdc_rep(11),
                                                                   gap=60 * S)]),
                               krb.Params(login_window_ns=120 * S))
    assert tx["login"].to_list() == [0, 0]


def test_different_principal_is_another_login():
    msgs = [kdc_req(10, nonce=1), krb_error(25), kdc_req(10, nonce=2, cname=("bob",), padata=[pa(2, enc_data(18))]),
            kdc_rep(11, cname=("bob",))]
    s = message_set(msgs, flows=[0, 0, 1, 1], from_client=[True, False, True, False])
    tx = tx_of([s])
    assert tx["login"].to_list() == [0, 1] and tx["is_error"].to_list() == [True, False]


def test_response_too_big_then_tcp_retry():
    udp = message_set([kdc_req(12, nonce=5, cname=None), krb_error(52)], from_client=[True, False],
                      ts=[1 * S, 1 * S + 500])
    tcp = message_set([kdc_req(12, nonce=5, cname=None), kdc_rep(13)], transport="tcp", flows=[7, 7],
                      from_client=[True, False], ts=[1 * S + 2000, 1 * S + 9000], frames=[3, 5])
    tx = tx_of([udp, tcp])
    assert tx.select("transport", "login", "login_step", "status", "is_error").rows() == [
        ("udp", 0, 1, "KRB_ERR_RESPONSE_TOO_BIG", False), ("tcp", 0, 2, "TGS-REP", False)]
    # the same error followed by another UDP try is not the TCP retry
    udp2 = message_set([kdc_req(12, nonce=5, cname=None), krb_error(52), kdc_req(12, nonce=6, cname=None)],
                       flows=[0, 0, 1], from_client=[True, False, True])
    assert tx_of([udp2])["is_error"].to_list() == [True, False]


def test_udp_and_tcp_flows_are_distinct_and_timeout():
    udp = message_set([kdc_req(10, nonce=1)], flows=[0])
    tcp = message_set([krb_error(6)], transport="tcp", flows=[0], from_client=[False], ts=[2 * S])
    assert tx_of([udp, tcp])["answered"].to_list() == [False]
    late = message_set([kdc_req(10, nonce=1), krb_error(6)], from_client=[True, False], ts=[1 * S, 40 * S])
    assert tx_of([late])["answered"].to_list() == [False]  # past Params.timeout_ns
    tx = krb.pair_transactions(krb.decode_messages([late]), krb.Params(timeout_ns=60 * S))
    assert tx["answered"].to_list() == [True]


def test_no_requests():
    tx = tx_of([message_set([kdc_rep(11)], from_client=[False])])
    assert tx.height == 0 and tx.columns == [c.name for c in krb.TRANSACTION_COLUMNS]


def test_transaction_columns_documented():
    names = [c.name for c in krb.TRANSACTION_COLUMNS]
    assert len(names) == len(set(names))
    assert all(c.description for c in krb.TRANSACTION_COLUMNS)
