"""LDAP decoder against tshark (per frame) and Zeek's ldap.log / ldap_search.log, on the real captures.

For every capture whose SOURCES.tsv purposes include ``ldap``, every frame tshark dissects as LDAP
or CLDAP is compared with the ldap_messages rows whose ``frame_last`` is that frame, in wire order
(tshark aggregates the fields of several LDAPMessages in one frame with commas, so do we).

Deliberate differences (asserted, not hidden):

- DNs: tshark shows the operation's DN in a different field per operation (``ldap.name`` for a
  bind, ``ldap.baseObject``, ``ldap.objectName``, ``ldap.object``, ``ldap.entry``,
  ``ldap.delRequest``); we have one ``dn`` column and ``op`` says which it is. The comparison
  rebuilds tshark's split. An empty DN prints nothing in tshark and is ``""`` here.
- ``scope``/``deref_aliases`` are names here (RFC 4511 ASN.1 identifiers), numbers in tshark.
- Filters: tshark renders ``ldap.filter`` only in its tree text (``Filter: ...``), does not
  escape values (``(name=Test()`` where RFC 4515 §3 requires ``(name=Test\\28)``), and folds an
  and/or of n items into left-nested pairs: the wire's 3-item AND {a, b, c} prints
  ``(&(&(a)(b))(c))`` (packet-ldap.c builds the string pairwise; Zeek copies that). We render the
  structure on the wire, ``(&(a)(b)(c))``, with RFC 4515 escaping; the comparison re-renders ours
  the Wireshark way (:func:`as_wireshark`) first. tshark also shows the CLDAP netlogon ping's
  ``NtVer`` value (4 binary octets) as a little-endian number (``0x00000016``); we keep the octets
  (``\\16\\00\\00\\00``), converted for the comparison. Against Zeek's ldap_search.log the same folding
  applies, but Zeek does escape per RFC 4515.
- zeek/ldap/ldap-max-recursion.pcap: every filter nests deeper than tshark's tree limit (tshark
  prints a "Dissector bug ... Maximum tree depth 500 exceeded" warning) and than our
  ``MAX_FILTER_DEPTH``: we report ``decode_error = "too deep"`` and no filter; messageID, op and
  base are still compared.
- A sicily (NTLM) bindResponse's matchedDN holds binary NTLM data: tshark stops at the first NUL,
  we keep every byte, escaped (EXPECTED_DIFFERENCES).
- SASL: with GSS-API Kerberos integrity only, tshark and we both decode the LDAPMessages inside the
  SASL buffer; sealed buffers and other mechanisms (SRP) are ``opaque`` rows here and no LDAP
  fields in tshark.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import polars as pl
import pytest

from tshark_ref import corpus_files, have_tshark, tshark_env, tshark_fields
from zeek_ref import zeek_log

CORPUS = Path(__file__).parent / "data" / "corpus"
BASELINES = CORPUS / "zeek-baselines"

# the tshark comparisons are skipped without tshark; the Zeek baselines need nothing but the corpus
needs_tshark = [pytest.mark.tshark, pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]


def tshark_test(fn):
    for mark in needs_tshark:
        fn = mark(fn)
    return fn

LDAP_FILES = [row["file"] for row in corpus_files("ldap")]
FILTER = "ldap || cldap"

# tshark field -> the ops (op_code) whose dn goes there
DN_FIELDS = {"ldap.name": (0,), "ldap.baseObject": (3,), "ldap.objectName": (4,), "ldap.object": (6,),
             "ldap.entry": (8, 12, 14), "ldap.delRequest": (10,)}
RESPONSE_OPS = (1, 5, 7, 9, 11, 13, 15, 24)
FIELDS = ["frame.number", "ldap.messageID", "ldap.protocolOp", "ldap.resultCode", "ldap.matchedDN",
          "ldap.errorMessage", "ldap.mechanism", "ldap.scope", "ldap.derefAliases", "ldap.sizeLimit",
          "ldap.timeLimit", "ldap.requestName", "ldap.abandonRequest", "ldap.newrdn", "ldap.newSuperior",
          *DN_FIELDS]
SCOPE_NUMBERS = {"baseObject": "0", "singleLevel": "1", "wholeSubtree": "2", "subordinateSubtree": "3"}
DEREF_NUMBERS = {"neverDerefAliases": "0", "derefInSearching": "1", "derefFindingBaseObj": "2", "derefAlways": "3"}




def ldap_messages(path: Path) -> pl.DataFrame:
    from analyzer import open_capture
    import analyzer.decoders.ldap  # noqa: F401

    with open_capture(path) as cap:
        return cap.frame("ldap_messages")


def _agg(expr: pl.Expr) -> pl.Expr:
    return expr.drop_nulls().cast(pl.String).str.join(",")


def ours_per_frame(m: pl.DataFrame) -> pl.DataFrame:
    m = m.filter(pl.col("op_code").is_not_null())
    dn = pl.col("dn").replace("", None)
    cols = [
        _agg(pl.col("message_id")).alias("ldap.messageID"),
        _agg(pl.col("op_code")).alias("ldap.protocolOp"),
        _agg(pl.col("result_code")).alias("ldap.resultCode"),
        _agg(pl.when(pl.col("op_code").is_in(RESPONSE_OPS)).then(pl.col("matched_dn").replace("", None)))
        .alias("ldap.matchedDN"),
        _agg(pl.when(pl.col("op_code").is_in(RESPONSE_OPS)).then(pl.col("diagnostic_message").replace("", None)))
        .alias("ldap.errorMessage"),
        _agg(pl.col("sasl_mechanism")).alias("ldap.mechanism"),
        _agg(pl.col("scope").replace_strict(SCOPE_NUMBERS, default=None)).alias("ldap.scope"),
        _agg(pl.col("deref_aliases").replace_strict(DEREF_NUMBERS, default=None)).alias("ldap.derefAliases"),
        _agg(pl.col("size_limit")).alias("ldap.sizeLimit"),
        _agg(pl.col("time_limit")).alias("ldap.timeLimit"),
        _agg(pl.when(pl.col("op_code") == 23).then(pl.col("oid"))).alias("ldap.requestName"),
        _agg(pl.col("abandon_id")).alias("ldap.abandonRequest"),
        _agg(pl.col("new_rdn")).alias("ldap.newrdn"),
        _agg(pl.col("new_superior")).alias("ldap.newSuperior"),
        *[_agg(pl.when(pl.col("op_code").is_in(ops)).then(dn)).alias(field) for field, ops in DN_FIELDS.items()],
    ]
    return m.group_by("frame_last", maintain_order=True).agg(cols).with_columns(
        pl.all().exclude("frame_last").replace("", None)).rename({"frame_last": "frame"})


def tshark_per_frame(path: Path) -> pl.DataFrame:
    ref = tshark_fields(path, FIELDS, display_filter=FILTER)
    return ref.with_columns(pl.col("frame.number").cast(pl.UInt32).alias("frame")).drop("frame.number") \
        .filter(pl.col("ldap.protocolOp").is_not_null())


COMPARED = [f for f in FIELDS if f != "frame.number"]

# (file, frame, field): differences explained here
EXPECTED_DIFFERENCES = {
    ("suricata-verify/krb5-request-frag-log/krb5-frag.pcap", 6, "ldap.matchedDN"):
        "a sicilyNegotiate bindResponse (MS-ADTS 5.1.1.1.3) carries the NTLM CHALLENGE_MESSAGE in "
        "matchedDN; tshark prints it as a C string (up to the first NUL: 'NTLMSSP'), we keep all of it, "
        "escaped",
}


def compare(path: Path) -> tuple[pl.DataFrame, dict[str, tuple[int, int]]]:
    ours = ours_per_frame(ldap_messages(path))
    ref = tshark_per_frame(path)
    both = ref.join(ours, on="frame", how="full", suffix="_ours", coalesce=True)
    figures = {f: (int(both[f].eq_missing(both[f + "_ours"]).sum()), both.height) for f in COMPARED}
    return both, figures


def _differences(name: str, both: pl.DataFrame) -> list[str]:
    out = []
    for row in both.iter_rows(named=True):
        for f in COMPARED:
            if row[f] != row[f + "_ours"] and (name, row["frame"], f) not in EXPECTED_DIFFERENCES:
                out.append(f"{name} frame {row['frame']} {f}: tshark {row[f]!r} ours {row[f + '_ours']!r}")
    return out


@tshark_test
@pytest.mark.parametrize("name", LDAP_FILES)
def test_ldap_fields_match_tshark(name):
    both, _ = compare(CORPUS / name)
    assert _differences(name, both) == []


@tshark_test
def test_ldap_message_counts_match_tshark():
    """protocolOp counts per capture (the SOURCES.tsv notes, re-derived from tshark)."""
    for name in LDAP_FILES:
        both, _ = compare(CORPUS / name)
        count = lambda col: sorted(both[col].drop_nulls().str.split(",").explode().value_counts().rows())  # noqa
        assert count("ldap.protocolOp") == count("ldap.protocolOp_ours"), name


# --- filters ------------------------------------------------------------------------------------------

def tshark_filters(path: Path) -> list[tuple[int, str]]:
    """(frame, filter text) of every searchRequest, from tshark's tree (``-V``)."""
    proc = subprocess.run(["tshark", "-n", "-r", str(path), "-Y", "ldap.protocolOp == 3", "-V", "-O", "ldap,cldap"],
                          capture_output=True, text=True, env=tshark_env(), timeout=600)
    out = []
    frame = None
    indent = None
    for line in proc.stdout.splitlines():
        m = re.match(r"^Frame (\d+):", line)
        if m:
            frame = int(m.group(1))
            continue
        m = re.match(r"^(\s*)searchRequest$", line)
        if m:
            indent = len(m.group(1)) + 4
            continue
        if indent is not None and line.startswith(" " * indent + "Filter: ") and line[indent] != " ":
            out.append((frame, line[indent + len("Filter: "):]))
            indent = None
    return out


def unescape_rfc4515(text: str) -> str:
    return re.sub(r"\\([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _parse(text: str, i: int = 0):
    """Our RFC 4515 text -> (tree, next index); tree = ("&"|"|"|"!", [children]) or the leaf text."""
    assert text[i] == "("
    op = text[i + 1]
    if op in "&|!":
        children = []
        i += 2
        while text[i] == "(":
            child, i = _parse(text, i)
            children.append(child)
        assert text[i] == ")"
        return (op, children), i + 1
    j = text.index(")", i)  # values escape ')' as \29, so the first ')' ends the leaf
    return text[i:j + 1], j + 1


def _wireshark(tree) -> str:
    """Render as Wireshark (and Zeek) do: an n-ary and/or folded into left-nested pairs,
    ``(&(&(a)(b))(c))``; a one-item and/or as the item itself; values unescaped."""
    if isinstance(tree, str):
        m = re.fullmatch(r"\(NtVer=((?:\\[0-9a-f]{2}){4})\)", tree)
        if m:  # MS-ADTS 6.3.3.2: tshark shows the CLDAP NtVer flags as a little-endian number
            raw = bytes.fromhex(m.group(1).replace("\\", ""))
            return f"(NtVer=0x{int.from_bytes(raw, 'little'):08x})"
        return unescape_rfc4515(tree)
    op, children = tree
    parts = [_wireshark(c) for c in children]
    if op == "!":
        return f"(!{parts[0]})"
    if not parts:
        return ""
    out = parts[0]
    for p in parts[1:]:
        out = f"({op}{out}{p})"
    return out


def as_wireshark(text: str) -> str:
    tree, end = _parse(text)
    assert end == len(text)
    return _wireshark(tree)


@tshark_test
@pytest.mark.parametrize("name", LDAP_FILES)
def test_ldap_filters_match_tshark(name):
    path = CORPUS / name
    m = ldap_messages(path).filter(pl.col("op_code") == 3)
    if name == "zeek/ldap/ldap-max-recursion.pcap":
        assert m.height == 100
        assert m["decode_error"].to_list() == ["too deep"] * 100
        assert m["filter"].null_count() == 100
        return
    ours = [(f, as_wireshark(t)) for f, t in m.select("frame_last", "filter").rows()]
    assert ours == tshark_filters(path)


def test_filter_escaping_is_rfc4515():
    """zeek/ldap/ldap_escaping_test.pcapng: the same values as Zeek's ldap_search.log (which
    escapes per RFC 4515; Zeek's log doubles the backslash)."""
    m = ldap_messages(CORPUS / "zeek/ldap/ldap_escaping_test.pcapng").filter(pl.col("op_code") == 3)
    zeek = zeek_log(BASELINES / "ldap/ldap_escaping_test.pcapng/scripts.base.protocols.ldap.filter_escaping"
                    / "ldap_search.log.1")
    theirs = [f.replace("\\\\", "\\") for f in zeek["filter"].to_list()]
    assert [_fold(f) for f in m["filter"].to_list()] == theirs
    assert m["filter"][6] == "(&(name=Test\\28with_a_\\2a\\29)(mail=*@example.com)(|(dept=accounting)(dept=operations)))"


def _fold(text: str) -> str:
    """Zeek's filter text: Wireshark's folding, RFC 4515 escapes kept."""
    def render(tree):
        if isinstance(tree, str):
            return tree
        op, children = tree
        parts = [render(c) for c in children]
        if op == "!":
            return f"(!{parts[0]})"
        out = parts[0] if parts else ""
        for p in parts[1:]:
            out = f"({op}{out}{p})"
        return out
    return render(_parse(text)[0])


# --- Zeek ----------------------------------------------------------------------------------------------

def zeek_result(name: str | None) -> str | None:
    """RFC 4511 resultCode identifier -> Zeek's spelling ('noSuchObject' -> 'no such object')."""
    if name is None:
        return None
    words = re.sub(r"([A-Z])", r" \1", name).lower().split()
    return " ".join("SASL" if w == "sasl" else w for w in words)


ZEEK_OPCODES = {"bindRequest": "bind", "unbindRequest": "unbind", "addRequest": "add", "modifyRequest": "modify",
                "delRequest": "delete", "modDNRequest": "modDN", "compareRequest": "compare",
                "extendedReq": "extended", "abandonRequest": "abandon"}
ZEEK_SCOPES = {"baseObject": "base", "singleLevel": "single", "wholeSubtree": "tree"}
ZEEK_DEREF = {"neverDerefAliases": "never", "derefInSearching": "search", "derefFindingBaseObj": "find",
              "derefAlways": "always"}

ZEEK_LDAP = {p.parent.parent.name: p.parent for p in BASELINES.glob("ldap/*/*/SOURCE.txt")}


def _ldap_transactions(name: str) -> pl.DataFrame:
    from analyzer import open_capture
    import analyzer.decoders.ldap  # noqa: F401

    with open_capture(CORPUS / "zeek/ldap" / name) as cap:
        return cap.frame("ldap_transactions")


@pytest.mark.parametrize("name", sorted(n for n, d in ZEEK_LDAP.items() if (d / "ldap.log").exists()))
def test_ldap_log_matches_zeek(name):
    """ldap.log: one line per non-search operation (message_id, opcode, result, object for bind and
    modify, argument = SASL mechanism for SASL binds)."""
    zeek = zeek_log(ZEEK_LDAP[name] / "ldap.log")
    tx = _ldap_transactions(name).filter(pl.col("operation") != "searchRequest")
    ours = tx.select(
        pl.col("message_id").cast(pl.String),
        (pl.col("operation").replace_strict(ZEEK_OPCODES, default=None)
         + pl.when(pl.col("auth") == "simple").then(pl.lit(" simple"))
         .when(pl.col("auth") == "sasl").then(pl.lit(" SASL")).otherwise(pl.lit(""))).alias("opcode"),
        pl.col("status").map_elements(zeek_result, return_dtype=pl.String).alias("result"),
        pl.when(pl.col("operation").is_in(["bindRequest", "modifyRequest"])).then(pl.col("dn").replace("", None))
        .alias("object"),
        pl.col("sasl_mechanism").alias("argument"),
    )
    theirs = zeek.select(
        "message_id", "opcode", "result",
        pl.when(pl.col("opcode").str.starts_with("bind") | (pl.col("opcode") == "modify")).then(pl.col("object"))
        .alias("object"),
        pl.when(pl.col("opcode") == "bind SASL").then(pl.col("argument")).alias("argument"),
    )
    assert sorted(ours.rows(), key=str) == sorted(theirs.rows(), key=str)


@pytest.mark.parametrize("name", sorted(n for n, d in ZEEK_LDAP.items() if (d / "ldap_search.log").exists()))
def test_ldap_search_log_matches_zeek(name):
    """ldap_search.log: one line per search (message_id, scope, deref, base, result_count = entries,
    result, filter). Some baselines were cut down with zeek-cut to (uid, filter, base_object)."""
    zeek = zeek_log(ZEEK_LDAP[name] / "ldap_search.log")
    tx = _ldap_transactions(name).filter(pl.col("operation") == "searchRequest")
    ours = tx.select(
        pl.col("message_id").cast(pl.String),
        pl.col("scope").replace_strict(ZEEK_SCOPES, default=None).alias("scope"),
        pl.col("deref_aliases").replace_strict(ZEEK_DEREF, default=None).alias("deref_aliases"),
        pl.col("dn").replace("", None).alias("base_object"),
        pl.col("entries").cast(pl.String).alias("result_count"),
        pl.col("status").map_elements(zeek_result, return_dtype=pl.String).alias("result"),
        pl.col("filter"),
    )
    cols = [c for c in ours.columns if c in zeek.columns]
    ours = ours.with_columns(pl.col("filter").map_elements(_fold, return_dtype=pl.String))
    theirs = zeek.select(cols).with_columns(pl.col("filter").str.replace_all("\\\\", "\\", literal=True))
    assert sorted(ours.select(cols).rows(), key=str) == sorted(theirs.rows(), key=str)


if __name__ == "__main__":  # agreement figures, for the report
    for name in LDAP_FILES:
        both, figures = compare(CORPUS / name)
        bad = {k: f"{a}/{b}" for k, (a, b) in figures.items() if a != b}
        print(name, both.height, "all agree" if not bad else bad)
        for line in _differences(name, both)[:12]:
            print("   ", line)
