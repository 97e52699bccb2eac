"""The ldap_sync frame (analyzer/decoders/ldap_sync.py): RFC 4533 controls and Sync Info, entryCSN /
entryUUID values, attribute digests, AD CNF DNs, and damage as a counted reason, never an exception."""
from __future__ import annotations

import random

import polars as pl
from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer.decoders import ldap_sync
from builders import integer, octets, seq, tlv
from fakes import message_set
from test_ldap_decoder import boolean, control, enum, msg, result, search

SYNC = "1.3.6.1.4.1.4203.1.9.1."
UUID = bytes.fromhex("fe0ba5ec81fa10419701032a861b0b4e")
CSN = "20261201174719.135239Z#000001#002#00000a"
COOKIE = "rid=001,sid=002,csn=" + CSN


def attrs(*pairs) -> bytes:
    return seq(*[seq(octets(a), tlv(0x31, *[octets(v) for v in (vs if isinstance(vs, tuple) else (vs,))]))
                 for a, vs in pairs])


def entry(dn: str, *pairs) -> bytes:
    return tlv(0x64, octets(dn), attrs(*pairs))


def state_ctrl(state: int, uuid: bytes = UUID, cookie: str | None = COOKIE) -> bytes:
    return control(SYNC + "2", value=seq(enum(state), octets(uuid), *([octets(cookie)] if cookie else [])))


def modify(dn: str, *changes) -> bytes:
    return tlv(0x66, octets(dn), seq(*[seq(enum(op), seq(octets(a), tlv(0x31, *[octets(v) for v in vals])))
                                       for op, a, vals in changes]))


def decode(*messages: bytes, from_client=None) -> pl.DataFrame:
    return ldap_sync.decode_sync([message_set(list(messages), transport="tcp", dport=389,
                                              from_client=from_client)])


def test_sync_state_entry_with_csn_uuid_cookie_and_attributes():
    m = msg(7, entry("cn=x,dc=example", ("objectClass", ("top", "organizationalRole")), ("description", "v1"),
                     ("entryCSN", CSN), ("entryUUID", "fe0ba5ec-81fa-1041-9701-032a861b0b4e")),
            state_ctrl(2))
    r = decode(m, from_client=[False]).row(0, named=True)
    assert r["kind"] == "sync_state" and r["state"] == "modify" and r["message_id"] == 7
    assert r["server"] == "10.0.0.2" and r["client"] == "10.0.0.1"  # the provider sends, the consumer receives
    assert r["entry_uuid"] == "fe0ba5ec-81fa-1041-9701-032a861b0b4e"
    assert r["cookie"] == COOKIE and r["cookie_rid"] == 1 and r["cookie_sid"] == 2 and r["cookie_csn"] == CSN
    assert r["entry_csn"] == CSN
    assert (r["csn_count"], r["csn_sid"], r["csn_mod"]) == (1, 2, 10)
    assert r["csn_ts_ns"] == 1796147239_135239_000  # 2026-12-01 17:47:19.135239 UTC
    assert r["attributes"] == ["objectClass", "description", "entryCSN", "entryUUID"]
    assert r["value_counts"] == [2, 1, 1, 1] and r["values"][1] == "v1"
    assert r["decode_error"] is None


def test_value_digests_equal_for_equal_values_only():
    a = msg(1, modify("cn=x", (2, "description", ["same"])))
    b = msg(2, modify("cn=x", (2, "description", ["same"])))
    c = msg(3, modify("cn=x", (2, "description", ["other"])))
    d = msg(4, modify("cn=x", (2, "description", ["sa", "me"])))  # same octets, split: a different value list
    df = decode(a, b, c, d)
    dig = [x[0] for x in df["value_digests"].to_list()]
    assert dig[0] == dig[1] and len({dig[0], dig[2], dig[3]}) == 3
    assert df["kind"].cast(pl.String).to_list() == ["modify"] * 4 and df["ops"][0].to_list() == ["replace"]
    assert df["server"][0] == "10.0.0.2" and df["client"][0] == "10.0.0.1"  # a request: the server is the dst


def test_sync_request_done_and_info_choices():
    req = msg(1, search("dc=example"), control(SYNC + "1", True, seq(enum(3), octets("rid=001,csn=x"), boolean(True))))
    done = msg(1, result(5, 0), control(SYNC + "3", value=seq(octets("rid=001,sid=001,csn=y"), boolean(True))))
    info_cookie = msg(1, tlv(0x79, tlv(0x80, (SYNC + "4").encode()), tlv(0x81, tlv(0x80, b"rid=001,sid=001"))))
    info_present = msg(1, tlv(0x79, tlv(0x80, (SYNC + "4").encode()),
                              tlv(0x81, tlv(0xA2, octets("c"), boolean(False)))))
    info_ids = msg(1, tlv(0x79, tlv(0x80, (SYNC + "4").encode()),
                          tlv(0x81, tlv(0xA3, octets("c"), boolean(True), tlv(0x31, octets(UUID), octets(UUID))))))
    other_ir = msg(1, tlv(0x79, tlv(0x80, b"1.2.3"), tlv(0x81, b"zz")))
    df = decode(req, done, info_cookie, info_present, info_ids, other_ir,
                from_client=[True, False, False, False, False, False])
    assert df["kind"].cast(pl.String).to_list() == ["sync_request", "sync_done", "sync_info", "sync_info", "sync_info"]
    r = df.to_dicts()
    assert r[0]["sync_mode"] == "refreshAndPersist" and r[0]["reload_hint"] is True and r[0]["dn"] == "dc=example"
    assert r[1]["refresh_deletes"] is True and r[1]["cookie_sid"] == 1 and r[1]["result_code"] == 0
    assert r[2]["info"] == "newcookie" and r[2]["cookie"] == "rid=001,sid=001"
    assert r[3]["info"] == "refreshPresent" and r[3]["refresh_done"] is False
    assert r[4]["info"] == "syncIdSet" and r[4]["sync_ids"] == 2 and r[4]["refresh_deletes"] is True


def test_refresh_done_defaults_true():
    m = msg(1, tlv(0x79, tlv(0x80, (SYNC + "4").encode()), tlv(0x81, tlv(0xA1))))
    r = decode(m, from_client=[False]).row(0, named=True)
    assert r["info"] == "refreshDelete" and r["refresh_done"] is True


def test_ad_conflict_dn_and_plain_entries():
    cnf = msg(2, entry("CN=web01\\0ACNF:5a1f0c2e-1b2c-4d5e-8f90-0123456789ab,OU=Servers,DC=corp", ("cn", "web01")))
    raw = msg(3, entry("CN=web02\nCNF:0a1f0c2e-1b2c-4d5e-8f90-0123456789ab,DC=corp", ("cn", "web02")))
    plain = msg(4, entry("CN=web03,DC=corp", ("cn", "web03")))  # nothing replication-related: no row
    csn_only = msg(5, entry("cn=y", ("entryCSN", "not a csn")))
    df = decode(cnf, raw, plain, csn_only, from_client=[False] * 4)
    assert df["message_id"].to_list() == [2, 3, 5]
    assert df["conflict_guid"].to_list()[:2] == ["5a1f0c2e-1b2c-4d5e-8f90-0123456789ab",
                                                 "0a1f0c2e-1b2c-4d5e-8f90-0123456789ab"]
    last = df.row(2, named=True)
    assert last["kind"] == "entry" and last["entry_csn"] == "not a csn" and last["csn_ts_ns"] is None


def test_truncated_and_damaged_messages_are_counted_not_raised():
    good = msg(7, entry("cn=x", ("description", "v1"), ("entryCSN", CSN)), state_ctrl(1))
    cut = good[:len(good) - 12]
    bad_state = msg(8, entry("cn=x", ("entryCSN", CSN)), control(SYNC + "2", value=seq(octets("notenum"))))
    df = decode(cut, bad_state, from_client=[False, False])
    assert df.height == 2
    assert df["decode_error"].null_count() == 0
    assert df["entry_csn"].to_list() == [CSN, CSN]  # read before the damage: kept


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**31), st.integers(min_value=0, max_value=64))
def test_random_damage_never_raises(seed, flips):
    rnd = random.Random(seed)
    base = bytearray(msg(9, entry("cn=x", ("description", "v"), ("entryCSN", CSN), ("entryUUID", "u")), state_ctrl(2)))
    for _ in range(flips):
        base[rnd.randrange(len(base))] = rnd.randrange(256)
    cut = bytes(base[:rnd.randrange(1, len(base) + 1)])
    df = decode(cut, bytes(base), from_client=[False, False])
    assert set(df.columns) == {c.name for c in ldap_sync.SYNC_COLUMNS}


def test_frame_schema_matches_the_declaration():
    df = decode(msg(1, modify("cn=x", (0, "l", ["a"]))))
    assert df.columns == [c.name for c in ldap_sync.SYNC_COLUMNS]
    empty = ldap_sync.decode_sync([])
    assert empty.height == 0 and empty.columns == df.columns


def test_integer_builder_roundtrip_sanity():
    assert integer(3) == b"\x02\x01\x03"
