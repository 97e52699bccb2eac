"""The committed real-server samples decode with herdscope's own decoders: the counts equal the facts
tshark recorded in samples/MANIFEST.toml ([capture.tshark]), computed the same way."""
import tomllib
from pathlib import Path

import polars as pl
import pytest

from shared_captures import shared_capture  # each sample decoded once per session

SAMPLES = Path(__file__).parent.parent / "samples"
FACTS = {c["file"]: c.get("tshark", {}) for c in tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())["capture"]}
RESOLVER = "10.77.0.53"
PROVIDERS = ("10.77.0.91", "10.77.0.92")  # ldap-repl-conflict's two slapd providers (p1, p2)
NOTIFICATION_ID = 0xFFFFFFFFFFFFFFFF


def facts(file):
    return FACTS[file]


@pytest.mark.parametrize("file", [f for f in FACTS if f.startswith("dns-")])
def test_dns_samples(file):
    cap = shared_capture(SAMPLES / file)
    m = cap.frame("dns_messages")
    queries = m.filter((pl.col("qr") == 0) & (pl.col("dst").cast(pl.String) == RESOLVER))
    f = facts(file)
    assert queries.height == f.get("dns_queries_to_resolver", f.get("queries_to_resolver"))
    assert queries["src"].n_unique() == f["dns_clients"]


@pytest.mark.parametrize("file", [f for f in FACTS if f.startswith("smb2-")])
def test_smb2_samples(file):
    cap = shared_capture(SAMPLES / file)
    m = cap.frame("smb2_messages")
    breaks = cap.frame("smb2_breaks")
    f = facts(file)
    req = m.filter(~pl.col("is_response"))
    assert req["src"].n_unique() == f["smb2_clients"]
    assert req.filter(pl.col("command") == "CREATE").height == f["smb2_creates"]
    notes = m.filter((pl.col("command") == "OPLOCK_BREAK") & (pl.col("message_id") == NOTIFICATION_ID))
    assert notes.height == f["smb2_break_notifications"] == breaks.height
    assert req.filter(pl.col("command") == "OPLOCK_BREAK").height == f["smb2_break_acks_from_clients"]
    pending = m.filter(pl.col("is_response") & (pl.col("command") == "CREATE") & (pl.col("status") == "STATUS_PENDING"))
    assert pending.height == f["smb2_create_pending"]


@pytest.mark.parametrize("file", [f for f in FACTS if f.startswith("tcp-")])
def test_tcp_samples(file):
    from analyzer.tcp import analysis as an

    cap = shared_capture(SAMPLES / file)
    conns = cap.frame("connections")
    seg = cap.frame("tcp_segments")
    f = facts(file)
    assert conns.filter(pl.col("saw_syn")).height == f["tcp_connections"]
    bits = an.RETRANSMISSION | an.FAST_RETRANSMISSION | an.SPURIOUS_RETRANSMISSION  # tshark's retransmission
    assert seg.filter((pl.col("analysis") & bits) != 0).height == f["retransmissions"]


@pytest.mark.parametrize("file", [f for f in FACTS if f.startswith("krb5-")])
def test_kerberos_samples(file):
    cap = shared_capture(SAMPLES / file)
    m = cap.frame("kerberos_messages")  # a missing decoder is a failure (KeyError)
    f = facts(file)
    counts = dict(m.group_by(pl.col("message").cast(pl.String)).len().iter_rows())
    assert (counts.get("AS-REQ", 0), counts.get("AS-REP", 0)) == (f["as_req"], f["as_rep"])
    assert (counts.get("TGS-REQ", 0), counts.get("TGS-REP", 0)) == (f["tgs_req"], f["tgs_rep"])
    errors = dict(m.filter(pl.col("error_code").is_not_null()).group_by("error_code").len().iter_rows())
    assert (errors.get(25, 0), errors.get(24, 0), errors.get(6, 0)) == (
        f["krb_error_25_preauth_required"], f["krb_error_24_preauth_failed"], f["krb_error_6_principal_unknown"])
    if "ap_req_in_carriers" in f:  # krb5 replay family: AP exchanges inside HTTP / LDAP, KDC request copies
        ap = cap.frame("kerberos_ap").filter(pl.col("carrier") != "kdc")
        req = ap.filter(pl.col("message") == "ap_req")
        assert req.height == f["ap_req_in_carriers"]
        assert ap.filter(pl.col("message") == "ap_rep").height == f["ap_rep_in_carriers"]
        assert req["rc_tag"].n_unique() == f["distinct_authenticators"]
        assert req.height - req["rc_tag"].n_unique() == f["authenticator_copies"]
        assert ap.filter(pl.col("error_code") == 34).height == f["krb_error_34_repeat"]
        tgs = m.filter(pl.col("message") == "TGS-REQ")["request_digest"]
        assert tgs.len() - tgs.n_unique() == f["tgs_req_copies"]


@pytest.mark.parametrize("file", [f for f in FACTS if f.startswith("ldap-")])
def test_ldap_samples(file):
    cap = shared_capture(SAMPLES / file)
    m = cap.frame("ldap_messages")
    f = facts(file)
    ops = dict(m.group_by(pl.col("op").cast(pl.String)).len().iter_rows())
    if "bind_requests" in f:
        assert ops.get("bindRequest", 0) == f["bind_requests"]
        assert ops.get("searchRequest", 0) == f["search_requests"]
        assert ops.get("unbindRequest", 0) == f["unbind_requests"]
        assert ops.get("searchResEntry", 0) == f["search_entries"]
    elif "sync_state_entries" in f:  # ldap-repl: client writes, what the providers pushed each other
        assert ops.get("modifyRequest", 0) == f["modify_requests"]
        assert ops.get("searchResEntry", 0) == f["search_entries"]
        assert ops.get("intermediateResponse", 0) == f["sync_info_messages"]
        states = cap.frame("ldap_sync").filter(pl.col("kind") == "sync_state")
        assert states.height == f["sync_state_entries"]
        pushed = states.filter((pl.col("state") == "modify") & pl.col("client").cast(pl.String).is_in(PROVIDERS))
        by = dict(pushed.group_by(pl.col("server").cast(pl.String)).len().iter_rows())
        assert [by.get(p, 0) for p in PROVIDERS] == [f["sync_modifies_pushed_by_p1"], f["sync_modifies_pushed_by_p2"]]
    elif "search_done" in f:  # ldap-saturation: searches and their answers
        assert ops.get("searchRequest", 0) == f["search_requests"]
        assert ops.get("searchResDone", 0) == f["search_done"]
        assert ops.get("searchResEntry", 0) == f["search_entries"]
        done = m.filter((pl.col("op") == "searchResDone") & (pl.col("result_code") == 0))
        assert done.height == f["search_success"]
        assert m.filter(pl.col("op") == "searchRequest")["src"].n_unique() == f["search_clients"]
    else:
        assert ops.get("modifyRequest", 0) == f["counter_modifies"]
