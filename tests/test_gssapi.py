"""GSS-API / SPNEGO token framing (analyzer.decoders.gssapi) through kerberos_ap.decode_tokens:
byte-literal tokens (RFC 2743 §3.1, RFC 1964 §1.1, RFC 4121 §4.1, RFC 4178 §4.2), the replay-cache
tag, malformed variants, and random / mutated tokens that must never raise."""
from __future__ import annotations

import random

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer.decoders import ber
from analyzer.decoders import kerberos_ap as ka
from builders import ctx, enc_data, integer, krb_error, octets, seq, ticket, tlv
from fakes import message_set
from fuzzing import GSSAPI_SPECIAL, mutate

KRB5 = bytes.fromhex("2a864886f712010202")
MS_KRB5 = bytes.fromhex("2a864882f712010202")
U2U = bytes.fromhex("2a864886f71201020203")
SPNEGO = bytes.fromhex("2b0601050502")
NTLM = bytes.fromhex("2b06010401823702020a")
NTLMSSP = b"NTLMSSP\x00\x01\x00\x00\x00" + b"\x07\x82\x08\xa2" + b"\x00" * 16


def oid(b: bytes) -> bytes:
    return tlv(0x06, b)


def ap_req(cipher=bytes(range(40)), etype=18, options=b"\x00\x20\x00\x00\x00", realm="EXAMPLE.COM",
           sname=("cifs", "fs.example.com"), tkt_etype=23, tkt_kvno=7) -> bytes:
    return tlv(0x6E, seq(ctx(0, integer(5)), ctx(1, integer(14)), ctx(2, tlv(0x03, options)),
                         ctx(3, ticket(realm, sname, etype=tkt_etype, kvno=tkt_kvno)),
                         ctx(4, enc_data(etype, None, cipher))))


AP_REP = tlv(0x6F, seq(ctx(0, integer(5)), ctx(1, integer(15)), ctx(2, enc_data(18, None, b"R" * 30))))


def framed(mech: bytes, tok_id: bytes, message: bytes) -> bytes:
    return tlv(0x60, oid(mech), tok_id, message)


def neg_init(inner: bytes, mechs=(MS_KRB5, KRB5, NTLM)) -> bytes:
    return tlv(0x60, oid(SPNEGO), ctx(0, seq(ctx(0, seq(*[oid(m) for m in mechs])), ctx(2, octets(inner)))))


def neg_resp(inner: bytes | None, mech=MS_KRB5, state=0) -> bytes:
    parts = [ctx(0, tlv(0x0A, bytes([state])))]
    if mech is not None:
        parts.append(ctx(1, oid(mech)))
    if inner is not None:
        parts.append(ctx(2, octets(inner)))
    parts.append(ctx(3, octets(b"M" * 16)))
    return ctx(1, seq(*parts))


def decode(*tokens: bytes, **kw) -> pl.DataFrame:
    return ka.decode_tokens("http", [message_set(list(tokens), transport="tcp", dport=80, **kw)])


def one(token: bytes) -> dict:
    out = decode(token)
    assert out.height == 1, out
    return out.row(0, named=True)


# --- framings --------------------------------------------------------------------------------------------

def test_krb5_framed_ap_req_every_field():
    r = one(framed(KRB5, b"\x01\x00", ap_req()))
    assert (r["carrier"], r["message"], r["mech"], r["spnego"], r["pvno"]) == ("http", "ap_req", "krb5", False, 5)
    assert r["ap_options"] == 0x20000000  # mutual-required
    assert (r["realm"], r["sname"], r["ticket_etype"], r["ticket_kvno"]) == ("EXAMPLE.COM", "cifs/fs.example.com", 23, 7)
    assert (r["authenticator_etype"], r["authenticator_kvno"]) == (18, None)
    assert r["rc_tag"] == bytes(range(40))[-12:]
    assert r["decode_error"] is None and r["error_code"] is None
    assert (r["frame"], r["frame_last"], r["ts_ns"], r["from_client"]) == (1, 1, 1_000_000_000, True)


@pytest.mark.parametrize("mech,name", [(KRB5, "krb5"), (MS_KRB5, "ms-krb5"), (U2U, "krb5-u2u")])
def test_mechanisms(mech, name):
    assert one(framed(mech, b"\x01\x00", ap_req()))["mech"] == name


def test_spnego_init_and_resp():
    req = one(neg_init(framed(KRB5, b"\x01\x00", ap_req())))
    assert (req["message"], req["mech"], req["spnego"], req["decode_error"]) == ("ap_req", "krb5", True, None)
    rep = one(neg_resp(framed(KRB5, b"\x02\x00", AP_REP)))
    assert (rep["message"], rep["mech"], rep["spnego"], rep["pvno"]) == ("ap_rep", "krb5", True, 5)
    assert rep["realm"] is None and rep["rc_tag"] is None and rep["ap_options"] is None


def test_unframed_tokens_take_spnegos_mechanism():
    assert one(neg_resp(AP_REP, mech=MS_KRB5))["mech"] == "ms-krb5"
    assert one(neg_init(ap_req(), mechs=(KRB5,)))["mech"] == "krb5"
    assert one(neg_resp(AP_REP, mech=None))["mech"] == "spnego"
    bare = one(ap_req())
    assert (bare["mech"], bare["spnego"], bare["message"]) == (None, False, "ap_req")


def test_krb_error_token():
    err = krb_error(41, e_text="bad checksum", sname=("HTTP", "web.example.com"))
    r = one(neg_resp(framed(KRB5, b"\x03\x00", err), state=2))
    assert (r["message"], r["error_code"], r["error_name"], r["e_text"]) == \
        ("krb_error", 41, "KRB_AP_ERR_MODIFIED", "bad checksum")
    assert (r["realm"], r["sname"], r["ticket_etype"], r["authenticator_etype"]) == \
        ("EXAMPLE.COM", "HTTP/web.example.com", None, None)
    assert one(framed(KRB5, b"\x03\x00", krb_error(34)))["error_name"] == "KRB_AP_ERR_REPEAT"


def test_tokens_without_kerberos_give_no_row():
    wrap_1964 = framed(KRB5, b"\x02\x01", b"\x00\x00\xff\xff" + b"x" * 20)  # RFC 1964 wrap token
    mic_1964 = framed(KRB5, b"\x01\x01", b"\x00\x00\xff\xff" + b"x" * 20)
    wrap_4121 = b"\x05\x04\x06\xff\x00\x00\x00\x1c" + b"\x00" * 8 + b"x" * 28  # RFC 4121 §4.2.6.2
    out = decode(NTLMSSP, neg_init(NTLMSSP, mechs=(NTLM,)), neg_resp(NTLMSSP, mech=NTLM), neg_resp(None, state=0),
                 wrap_1964, mic_1964, wrap_4121, framed(NTLM, b"", NTLMSSP), b"", b"Negotiate")
    assert out.height == 0


def test_several_tokens_keep_their_carrier_rows():
    out = decode(NTLMSSP, framed(KRB5, b"\x01\x00", ap_req()), neg_resp(None), neg_resp(framed(KRB5, b"\x02\x00", AP_REP)),
                 frames=[10, 11, 12, 13])
    assert out["frame"].to_list() == [11, 13] and out["message"].to_list() == ["ap_req", "ap_rep"]
    assert out.columns == [c.name for c in ka.COLUMNS]
    for c in ka.COLUMNS:
        assert c.description


# --- the replay-cache tag --------------------------------------------------------------------------------

@pytest.mark.parametrize("etype,length", sorted(ka.RC_TAG_LENGTHS.items()))
def test_rc_tag_length_per_etype(etype, length):
    cipher = bytes(range(200, 256)) + bytes(range(60))
    assert one(ap_req(cipher=cipher, etype=etype))["rc_tag"] == cipher[-length:]


def test_rc_tag_null_when_unknown_or_short():
    assert one(ap_req(etype=99))["rc_tag"] is None  # not an enctype MIT knows
    assert one(ap_req(etype=6))["rc_tag"] is None  # des3-cbc-raw: a zero checksum length
    assert one(ap_req(cipher=b"x" * 11, etype=18))["rc_tag"] is None  # shorter than the tag
    assert one(ap_req(cipher=b"x" * 12, etype=18))["rc_tag"] == b"x" * 12


def test_same_authenticator_same_tag_other_authenticator_other_tag():
    a = ap_req(cipher=b"A" * 20 + b"tag-one-xxxx")
    b = ap_req(cipher=b"B" * 20 + b"tag-one-xxxx", realm="OTHER.ORG")
    c = ap_req(cipher=b"A" * 20 + b"tag-two-xxxx")
    tags = decode(framed(KRB5, b"\x01\x00", a), neg_init(framed(KRB5, b"\x01\x00", b)), c)["rc_tag"].to_list()
    assert tags[0] == tags[1] == b"tag-one-xxxx" and tags[2] == b"tag-two-xxxx"


# --- damage ----------------------------------------------------------------------------------------------

def test_tok_id_and_message_disagree():
    r = one(framed(KRB5, b"\x01\x00", AP_REP))
    assert (r["message"], r["decode_error"]) == ("ap_rep", "bad value")


def test_other_kerberos_message_in_a_token():
    tgs = tlv(0x6C, seq(ctx(1, integer(5)), ctx(2, integer(12))))
    r = one(framed(KRB5, b"\x01\x00", tgs))
    assert r["message"] is None and r["decode_error"] in ("unexpected tag", "missing field")


def test_truncated_tokens_are_counted_rows():
    full = neg_init(framed(KRB5, b"\x01\x00", ap_req()))
    for cut in (len(full) - 1, len(full) // 2, 40, 20, 12):
        r = one(full[:cut])
        assert r["decode_error"] == "truncated", (cut, r)
    # cut before the ticket's sname: the realm already decoded is kept
    r = one(framed(KRB5, b"\x01\x00", ap_req())[:60])
    assert r["message"] == "ap_req" and r["decode_error"] == "truncated"


def test_bad_lengths():
    tok = bytearray(framed(KRB5, b"\x01\x00", ap_req()))
    assert tok[1] == 0x81 or tok[1] == 0x82
    bogus = bytes(tok[:1]) + b"\x84\xff\xff\xff\xff" + bytes(tok[3 if tok[1] == 0x81 else 4:])
    assert one(bogus)["decode_error"] == "truncated"
    no_tok_id = tlv(0x60, oid(KRB5), b"\x01")
    assert one(no_tok_id)["decode_error"] == "bad length" or one(no_tok_id)["decode_error"] == "truncated"
    inner_too_long = neg_resp(framed(KRB5, b"\x02\x00", AP_REP))
    b = bytearray(inner_too_long)
    i = b.find(b"\x04", 20)  # the responseToken OCTET STRING
    b[i + 1] = 0x7F
    assert one(bytes(b))["decode_error"] in ("bad length", "truncated")
    spnego_in_spnego = neg_init(neg_init(framed(KRB5, b"\x01\x00", ap_req())))
    assert one(spnego_in_spnego)["decode_error"] == "unexpected tag"


def test_damaged_spnego_counts_unless_it_named_another_mechanism():
    assert one(b"\xa1\x05\x30\x03\xa0\x01")["decode_error"] == "truncated"
    assert decode(neg_init(NTLMSSP, mechs=(NTLM,))[:-5]).height == 0


# --- hostile input ---------------------------------------------------------------------------------------

SAMPLES = [framed(KRB5, b"\x01\x00", ap_req()), neg_init(framed(MS_KRB5, b"\x01\x00", ap_req(etype=23))),
           neg_resp(framed(KRB5, b"\x02\x00", AP_REP)), neg_resp(framed(KRB5, b"\x03\x00", krb_error(34, e_text="r"))),
           neg_resp(AP_REP), ap_req(), neg_init(NTLMSSP, mechs=(NTLM,))]


def _mutate(data: bytes, rnd: random.Random) -> bytes:
    return mutate(data, rnd, GSSAPI_SPECIAL)


def _sane(out: pl.DataFrame, n: int):
    assert out.height <= n
    assert set(out["decode_error"].drop_nulls()) <= set(ber.STATUS_NAMES.values())
    ok = out.filter(pl.col("decode_error").is_null())
    assert ok["message"].null_count() == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=150), min_size=1, max_size=8))
def test_random_tokens_never_raise(tokens):
    _sane(decode(*tokens), len(tokens))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
def test_mutated_tokens_never_raise(seed):
    rnd = random.Random(seed)
    tokens = [_mutate(rnd.choice(SAMPLES), rnd) for _ in range(8)]
    _sane(decode(*tokens), len(tokens))
