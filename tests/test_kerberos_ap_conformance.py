"""kerberos_ap against tshark, field by field, on the corpus captures that carry Kerberos in SMB2
SESSION_SETUP, LDAP SASL binds and TGS-REQs (SOURCES.tsv purposes ``kerberos``, ``smb2``, ``ldap``).

tshark's side comes from its JSON tree (``-T json``), so each field is read inside its own AP-REQ /
AP-REP / KRB-ERROR element (``kerberos.ap_req_element`` and friends): the ticket's realm, sname,
enc-part etype and kvno, the authenticator's etype, kvno and cipher (whose tail is the replay-cache
tag), ap-options, error-code, e-text, and the krb5 OID of the GSS framing (``spnego.krb5_oid`` /
``gss-api.OID``). Rows are matched per frame (tshark shows a message at the carrier's last frame:
our ``frame_last``), in wire order.

Deliberate differences (asserted, not hidden):

- only SMB2, LDAP and port 88 carry rows here: tshark also finds Kerberos in SMB1 Session Setup AndX
  (zeek/krb/smb_gssapi.pcap), DCE/RPC bind authentication and DNS TKEY, which are not carriers of
  ``kerberos_ap``: the comparison is restricted to frames with ``smb2``, ``ldap`` or port 88.
- tshark dissects the AP-REQ of a TGS-REQ and the standalone messages alike; port-88 rows are only
  the PA-TGS-REQ AP-REQs (``carrier`` kdc), so port-88 frames are compared on their AP-REQ elements.
"""
from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import polars as pl
import pytest

from tshark_ref import corpus_files, have_tshark, tshark_env

CORPUS = Path(__file__).parent / "data" / "corpus"
pytestmark = [pytest.mark.tshark, pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]

REVIEW = Path(__file__).parent / "data" / "review"
# reviewed captures kept out of the ordinary corpus (tests/test_corpus_review.py: an exploit's burst of
# connections) that carry Kerberos in SMB2: 19 SESSION_SETUP AP-REQ / AP-REP pairs
REVIEWED = ["suricata-verify/smb2-09-trunc-file-logging/input.pcap"]
FILES = sorted({row["file"] for p in ("kerberos", "smb2", "ldap") for row in corpus_files(p)} | set(REVIEWED))


def _path(name: str) -> Path:
    return (REVIEW if name in REVIEWED else CORPUS) / name
# the real-server recordings with Kerberos in LDAP SASL GSSAPI binds and HTTP Negotiate (samples/MANIFEST.toml)
SAMPLES = Path(__file__).parent.parent / "samples"
SAMPLE_FILES = sorted(str(p.relative_to(SAMPLES)) for p in [*SAMPLES.glob("krb5-*.pcap*"), *SAMPLES.glob("eval/krb5-*.pcap*")])
FILTER = "kerberos && (smb2 || ldap || http || udp.port==88 || tcp.port==88)"
ELEMENTS = {"kerberos.ap_req_element": "ap_req", "kerberos.ap_rep_element": "ap_rep",
            "kerberos.krb_error_element": "krb_error"}


class _Obj(list):
    """A JSON object as its (key, value) pairs: tshark repeats keys (name-string components)."""


def _get(obj, key, default=None):
    return next((v for k, v in obj if k == key), default)


def _all(obj, key):
    """Every value of ``key`` anywhere below ``obj`` (depth first, in order)."""
    out = []
    if isinstance(obj, _Obj):
        for k, v in obj:
            if k == key:
                out.append(v)
            out += _all(v, key)
    elif isinstance(obj, list):
        for v in obj:
            out += _all(v, key)
    return out


def _int(v):
    return None if v is None else int(v)


def _element(kind: str, el, oid) -> dict:
    row = {"message": kind, "mech_oid": oid, "pvno": _int(_get(el, "kerberos.pvno"))}
    if kind == "ap_req":
        opts = _get(el, "kerberos.ap_options")
        row["ap_options"] = int(opts.replace(":", ""), 16) if opts else None
        ticket = _get(el, "kerberos.ticket_element")
        enc = _get(ticket, "kerberos.enc_part_element")
        row["realm"] = _get(ticket, "kerberos.realm")
        row["sname"] = "/".join(_all(_get(ticket, "kerberos.sname_element"), "kerberos.SNameString")) or None
        row["ticket_etype"] = _int(_get(enc, "kerberos.etype"))
        row["ticket_kvno"] = _int(_get(enc, "kerberos.kvno"))
        auth = _get(el, "kerberos.authenticator_element")
        row["authenticator_etype"] = _int(_get(auth, "kerberos.etype"))
        row["authenticator_kvno"] = _int(_get(auth, "kerberos.kvno"))
        cipher = _get(auth, "kerberos.cipher")
        row["cipher"] = bytes.fromhex(cipher.replace(":", "")) if cipher else None
    elif kind == "krb_error":
        row["error_code"] = _int(_get(el, "kerberos.error_code"))
        row["realm"] = _get(el, "kerberos.realm")
        row["sname"] = "/".join(_all(_get(el, "kerberos.sname_element"), "kerberos.SNameString")) or None
        row["e_text"] = _get(el, "kerberos.e_text")
    return row


def _walk(obj, oid, rows, frame, in_tgs):
    """Collect the AP elements below ``obj``; ``oid``: the nearest GSS mechanism OID seen before;
    ``in_tgs``: below a TGS-REQ (the PA-TGS-REQ AP-REQ)."""
    if isinstance(obj, _Obj):
        for k, v in obj:
            if k in ("spnego.krb5_oid", "gss-api.OID") and isinstance(v, str):
                oid = v
            if k in ELEMENTS:
                rows.append({"frame": frame, "in_tgs": in_tgs, **_element(ELEMENTS[k], v, oid)})
            else:
                _walk(v, oid, rows, frame, in_tgs or k == "kerberos.tgs_req_element")
    elif isinstance(obj, list):
        for v in obj:
            _walk(v, oid, rows, frame, in_tgs)


@functools.lru_cache(maxsize=None)
def tshark_rows(path: Path) -> list[dict]:
    proc = subprocess.run(["tshark", "-r", str(path), "-Y", FILTER, "-T", "json"], capture_output=True,
                          text=True, env=tshark_env(), timeout=600)
    packets = json.loads(proc.stdout or "[]", object_pairs_hook=_Obj)
    rows: list[dict] = []
    for pkt in packets:
        layers = _get(_get(pkt, "_source"), "layers")
        frame = int(_get(_get(layers, "frame"), "frame.number"))
        found: list[dict] = []
        _walk(layers, None, found, frame, False)
        carried = any(k in ("smb2", "ldap", "http") for k, _ in layers)
        # port 88: only the PA-TGS-REQ AP-REQs are kerberos_ap rows (carrier kdc)
        rows += [r for r in found if carried or r["in_tgs"]]
    return rows


@functools.lru_cache(maxsize=None)
def ours(path: Path) -> pl.DataFrame:
    from analyzer import open_capture
    with open_capture(path) as cap:
        return cap.frame("kerberos_ap")


OIDS = {"krb5": "1.2.840.113554.1.2.2", "ms-krb5": "1.2.840.48018.1.2.2", "krb5-u2u": "1.2.840.113554.1.2.2.3"}
COMPARED = ("message", "pvno", "ap_options", "realm", "sname", "ticket_etype", "ticket_kvno",
            "authenticator_etype", "authenticator_kvno", "rc_tag", "error_code", "e_text", "mech_oid")
RC_TAG_LENGTHS = {17: 12, 18: 12, 19: 16, 20: 24, 23: 16, 24: 16, 16: 20, 25: 16, 26: 16}


def expected_row(ref: dict) -> dict:
    """tshark's row in our columns: the tag from the authenticator cipher's tail (MIT's rule)."""
    out = {c: ref.get(c) for c in COMPARED if c not in ("rc_tag",)}
    n = RC_TAG_LENGTHS.get(ref.get("authenticator_etype"))
    cipher = ref.get("cipher")
    out["rc_tag"] = cipher[-n:] if cipher is not None and n and len(cipher) >= n else None
    return out


def our_rows(df: pl.DataFrame) -> list[dict]:
    rows = []
    for r in df.iter_rows(named=True):
        d = {c: r.get(c) for c in COMPARED if c != "mech_oid"}
        d["message"] = r["message"]
        d["mech_oid"] = OIDS.get(r["mech"]) if r["mech"] else None
        rows.append({"frame": r["frame_last"], **d})
    return rows


def compare(path: Path) -> tuple[list, dict[str, tuple[int, int]]]:
    """(differences [(frame, field, tshark, ours)], per field (agreeing, compared))."""
    ref = [{"frame": r["frame"], **expected_row(r)} for r in tshark_rows(path)]
    mine = our_rows(ours(path))
    by_frame: dict[int, tuple[list, list]] = {}
    for r in ref:
        by_frame.setdefault(r["frame"], ([], []))[0].append(r)
    for r in mine:
        by_frame.setdefault(r["frame"], ([], []))[1].append(r)
    diffs, figures = [], {c: [0, 0] for c in COMPARED}
    for frame, (a, b) in sorted(by_frame.items()):
        if len(a) != len(b):
            diffs.append((frame, "rows", len(a), len(b)))
            continue
        for x, y in zip(a, b):
            for c in COMPARED:
                figures[c][1] += 1
                if x[c] == y[c]:
                    figures[c][0] += 1
                else:
                    diffs.append((frame, c, x[c], y[c]))
    return diffs, {c: tuple(v) for c, v in figures.items()}


# (file, frame, field): a difference explained next to the entry
EXPECTED_DIFFERENCES: dict[tuple[str, int, str], str] = {
    ("pcapplusplus/PacketExamples/ldap.pcapng", 3, "rows"):
        "an example file of unrelated packets: the bindResponse of frame 3 is on another TCP connection "
        "than the GSS-SPNEGO bindRequest of frame 1, so tshark, which picks the serverSaslCreds dissector "
        "from the mechanism it saw on the conversation, shows the bytes raw; we read the token by its "
        "bytes (SPNEGO negTokenResp around a krb5 AP-REP)",
}


@pytest.mark.parametrize("name", FILES)
def test_kerberos_ap_agrees_with_tshark(name):
    path = _path(name)
    diffs, figures = compare(path)
    unexplained = [d for d in diffs if (name, d[0], d[1]) not in EXPECTED_DIFFERENCES]
    assert unexplained == [], f"{name}: {unexplained[:10]}"
    expected = {(f, c) for (n, f, c) in EXPECTED_DIFFERENCES if n == name}
    assert {(d[0], d[1]) for d in diffs} == expected, "an expected difference went away: update the table"


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_kerberos_ap_agrees_with_tshark_on_samples(name):
    diffs, figures = compare(SAMPLES / name)
    assert diffs == [], f"{name}: {diffs[:10]}"


def test_samples_carry_ldap_gssapi_and_http():
    """The LDAP SASL GSSAPI (not SPNEGO) and HTTP Negotiate carriers, which the corpus lacks, are in
    the samples the comparison above covers."""
    seen = set()
    for name in SAMPLE_FILES:
        df = ours(SAMPLES / name)
        seen |= set(zip(df["carrier"].cast(pl.String), df["message"].cast(pl.String), df["spnego"]))
    assert {("ldap", "ap_req", False), ("ldap", "ap_rep", False)} <= seen
    if any("http" in n for n in SAMPLE_FILES):
        assert {("http", "ap_req", True), ("http", "krb_error", True)} <= seen


def test_conformance_figures():
    """Every compared field agrees on every AP row of the corpus (the figures of the report)."""
    total = {c: [0, 0] for c in COMPARED}
    for name in FILES:
        _, figures = compare(_path(name))
        for c, (same, n) in figures.items():
            total[c][0] += same
            total[c][1] += n
    assert total["message"][1] >= 60  # 19 + 19 SMB2 pairs in one file alone, LDAP binds, TGS-REQs
    assert all(same == n for same, n in total.values()), total


def test_corpus_has_each_carrier():
    """The comparison above is not vacuous: the corpus copies carry AP-REQs in SMB2, LDAP and TGS-REQs,
    and AP-REPs in SMB2 and LDAP."""
    seen = set()
    for name in FILES:
        df = ours(_path(name))
        seen |= set(zip(df["carrier"].cast(pl.String), df["message"].cast(pl.String)))
    assert {("smb2", "ap_req"), ("smb2", "ap_rep"), ("ldap", "ap_req"), ("ldap", "ap_rep"),
            ("kdc", "ap_req")} <= seen
