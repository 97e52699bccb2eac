"""http_messages and the ``http`` carrier of kerberos_ap against tshark, field by field.

Captures: the corpus copies with HTTP on ports 80/8080 (tests/data/corpus; none carries Negotiate) and
the real recordings samples/krb5-http-replay(-healthy).pcapng (Apache 2.4 + mod_auth_gssapi, curl
--negotiate and replayed Authorization headers, one request per connection) and
samples/eval/krb5-http-cached-token(-healthy).pcap (60 requests on one keep-alive connection): every
request and response there carries a SPNEGO token.

HTTP: tshark shows a message at the frame that completes it, body included (``http.desegment_body``):
our ``frame_last``. Compared per frame (several messages in one frame: comma-joined, in wire order):
http.request.method, http.request.uri, http.response.code, http.host, http.content_length_header and the
first word (the scheme) of http.authorization and http.www_authenticate.

Kerberos: tshark's JSON tree read as tests/test_kerberos_ap_conformance.py reads it (its element
walker, the replay-cache tag from the authenticator cipher's tail), restricted to frames with ``http``;
every kerberos_ap field is compared with our ``carrier == "http"`` rows at the same frame.

Deliberate differences (asserted, not hidden):

- a response whose body the capture does not hold to its end (``complete`` False: the capture stops,
  or segments were never captured): tshark waits for the body and shows no message; we show the
  header (HTTP_INCOMPLETE below).
- frames where tshark's TCP analysis sets the segment aside (out-of-order / retransmission after a
  reused port, "previous segment not captured" while the bytes arrive later) or its reassembly drops a
  817 kB body: tshark shows no HTTP there, our reassembly frames the whole message
  (EXPECTED_DIFFERENCES; with ``-o http.desegment_body:FALSE`` tshark does show those status lines,
  where it shows one at all).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl
import pytest

from test_kerberos_ap_conformance import COMPARED, _get, _Obj, _walk, expected_row, our_rows
from tshark_ref import have_tshark, tshark_env, tshark_fields

ROOT = Path(__file__).parent.parent
CORPUS = Path(__file__).parent / "data" / "corpus"
pytestmark = [pytest.mark.tshark, pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]

SAMPLES = [ROOT / "samples" / "krb5-http-replay.pcapng", ROOT / "samples" / "krb5-http-replay-healthy.pcapng"]
# one keep-alive connection, 60 requests each (samples/realkit/eval_http.py)
EVAL = [ROOT / "samples" / "eval" / "krb5-http-cached-token.pcap",
        ROOT / "samples" / "eval" / "krb5-http-cached-token-healthy.pcap"]
CORPUS_HTTP = [CORPUS / f for f in (
    "zeek/wikipedia.pcap", "pcapplusplus/PcapExamples/four_ipv6_http_streams.pcap",
    "pcapplusplus/PcapExamples/raw_ip.pcap", "zeek/http/206_example_b.pcap", "zeek/tcp/miss_end_data.pcap",
    "zeek/vlan-collisions.pcap", "zeek/vlan-qinqinq.pcap", "zeek/http/iso-download.pcap.gz",
    "zeek/dce-rpc/mapi.pcap", "suricata-verify/bug-4376/syn_retransmit_with_ts.pcap",
    "suricata-verify/tcp-rst-unacked-stream-10/TLPW1-tcp-174.56.47.59-10.3.11.101-tcp-80-49309.pcap",
    "suricata-verify/tls/tls-subjectaltname/input.pcap", "suricata-verify/http-mime-truncated/input.pcap")]
FILES = CORPUS_HTTP + SAMPLES + EVAL
FIELDS = {"method": "http.request.method", "target": "http.request.uri", "status_code": "http.response.code",
          "host": "http.host", "content_length": "http.content_length_header",
          "authorization": "http.authorization", "www_authenticate": "http.www_authenticate"}
SCHEME_FIELDS = ("authorization", "www_authenticate")  # tshark: the whole value; compared: its scheme

# (file, frame): why tshark shows no HTTP message at a frame where we frame a complete one
EXPECTED_DIFFERENCES: dict[tuple[str, int], str] = {
    ("zeek/http/206_example_b.pcap", 953): "an 817 kB 206 body, every byte captured: tshark shows no message "
    "(the status line at frame 5 with http.desegment_body off); it does show the two 206 kB ones",
    ("suricata-verify/tls/tls-subjectaltname/input.pcap", 829): "tshark calls frame 592 (the status line) "
    "TCP Out-Of-Order and 829 a Continuation",
    ("suricata-verify/tls/tls-subjectaltname/input.pcap", 1565): "tshark shows the status line at 1016 only "
    "with http.desegment_body off; reassembled it shows none",
    ("suricata-verify/tls/tls-subjectaltname/input.pcap", 1601): "tshark marks the PNG response (status line "
    "at 790) Malformed and shows no reassembled message",
    ("suricata-verify/tls/tls-subjectaltname/input.pcap", 2005): "after the port reuse of frame 1996 tshark "
    "calls the whole 404 response a TCP Retransmission and skips it",
    ("zeek/dce-rpc/mapi.pcap", 167): "tshark marks frame 167 'previous segment not captured' and shows a "
    "Continuation; the segment is in the capture, retransmitted",
}


def rel(path: Path) -> str:
    return str(path.relative_to(CORPUS)) if CORPUS in path.parents else path.name


def ours(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    from analyzer import open_capture
    with open_capture(path) as cap:
        return cap.frame("http_messages"), cap.frame("kerberos_ap")


def _joined(values) -> str | None:
    vals = [str(v) for v in values if v is not None]
    return ",".join(vals) if vals else None


def compare_http(path: Path):
    """(differences [(frame, field, tshark, ours)], frames tshark shows, incomplete frames of ours only,
    per field (agreeing, compared))."""
    ref = tshark_fields(path, ["frame.number", *FIELDS.values()],
                        display_filter="http && (tcp.port == 80 || tcp.port == 8080)")
    msgs, _ = ours(path)
    mine: dict[int, list[dict]] = {}
    for r in msgs.sort("frame_last", "ts_first_ns").iter_rows(named=True):
        mine.setdefault(r["frame_last"], []).append(r)
    theirs = {int(r["frame.number"]): r for r in ref.iter_rows(named=True)}
    diffs, incomplete, figures = [], [], {c: [0, 0] for c in FIELDS}
    for frame in sorted(set(mine) | set(theirs)):
        rows = mine.get(frame, [])
        t = theirs.get(frame)
        if t is None or all(t[f] is None for f in FIELDS.values()):
            if rows and t is None and not any(r["complete"] for r in rows):
                incomplete.append(frame)
            elif rows:
                diffs.append((frame, "message", None, len(rows)))
            continue
        for col, field in FIELDS.items():
            want = t[field]
            if want is not None and col in SCHEME_FIELDS:
                want = ",".join(v.split(" ")[0].rstrip(",") for v in want.split(","))
            got = _joined(r[col] for r in rows)
            figures[col][1] += want is not None or got is not None
            if want == got:
                figures[col][0] += want is not None or got is not None
            else:
                diffs.append((frame, col, want, got))
    return diffs, len(theirs), incomplete, {c: tuple(v) for c, v in figures.items()}


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_http_agrees_with_tshark(path):
    diffs, _, incomplete, _ = compare_http(path)
    name = rel(path)
    unexplained = [d for d in diffs if (name, d[0]) not in EXPECTED_DIFFERENCES]
    assert unexplained == [], f"{name}: {unexplained[:10]}"
    expected = {f for (n, f) in EXPECTED_DIFFERENCES if n == name}
    assert {d[0] for d in diffs} == expected, "an expected difference went away: update the table"
    msgs, _ = ours(path)
    assert msgs["decode_error"].null_count() == msgs.height  # real traffic: everything decodes
    # what only we show is a message the capture does not hold to its end
    assert set(incomplete) <= set(msgs.filter(~pl.col("complete"))["frame_last"].to_list())


def test_http_figures():
    """The figures of the report: on the samples every request and response field agrees."""
    for path in SAMPLES:
        diffs, shown, incomplete, figures = compare_http(path)
        assert diffs == [] and incomplete == []
        assert shown == 272  # 136 requests and their responses, each in one frame
        assert all(same == n for same, n in figures.values()), figures
        assert figures["authorization"][1] == 136 and figures["www_authenticate"][1] == 136


# --- Kerberos inside the Negotiate tokens ----------------------------------------------------------------

def tshark_kerberos(path: Path) -> list[dict]:
    proc = subprocess.run(["tshark", "-r", str(path), "-Y", "kerberos && http", "-T", "json"],
                          capture_output=True, text=True, env=tshark_env(), timeout=600)
    rows: list[dict] = []
    for pkt in json.loads(proc.stdout or "[]", object_pairs_hook=_Obj):
        layers = _get(_get(pkt, "_source"), "layers")
        frame = int(_get(_get(layers, "frame"), "frame.number"))
        _walk(layers, None, rows, frame, False)
    return rows


@pytest.mark.parametrize("path", SAMPLES + EVAL, ids=rel)
def test_kerberos_in_http_agrees_with_tshark(path):
    ref = [{"frame": r["frame"], **expected_row(r)} for r in tshark_kerberos(path)]
    _, ap = ours(path)
    mine = our_rows(ap.filter(pl.col("carrier") == "http"))
    assert len(ref) == len(mine) and len(ref) >= 120  # every request and response carries a token
    ref.sort(key=lambda r: r["frame"])
    mine.sort(key=lambda r: r["frame"])
    diffs = [(a["frame"], c, a[c], b[c]) for a, b in zip(ref, mine) for c in ("frame", *COMPARED) if a[c] != b[c]]
    assert diffs == []
    assert ap.filter(pl.col("carrier") == "http")["decode_error"].null_count() == len(mine)


def test_replay_sample_shows_the_rejections():
    """The recording's ground truth, as decoded: 120 replayed AP-REQs (3 distinct replay-cache tags
    besides the originals), each answered 401 with a SPNEGO reject carrying KRB-ERROR 34."""
    msgs, ap = ours(SAMPLES[0])
    http_ap = ap.filter(pl.col("carrier") == "http")
    errors = http_ap.filter(pl.col("message") == "krb_error")
    assert errors.height == 120 and set(errors["error_code"].to_list()) == {34}
    assert set(errors["error_name"].to_list()) == {"KRB_AP_ERR_REPEAT"}
    reqs = http_ap.filter(pl.col("message") == "ap_req")
    tags = reqs.group_by("rc_tag").len().sort("len", descending=True)
    assert tags["len"].head(3).to_list() == [41, 41, 41] and tags.height == 16
    rejected = msgs.filter(pl.col("status_code") == 401)
    assert rejected.height == 120 and rejected["negotiate_token_length"].null_count() == 0
    assert set(errors["frame"].to_list()) == set(rejected["frame_first"].to_list())
    # the replayed requests are what the 401s answer
    replayed = msgs.filter(pl.col("frame_first").is_in(rejected["request_frame"].implode()))
    assert replayed["src"].cast(pl.String).unique().to_list() == ["10.77.2.200"]
