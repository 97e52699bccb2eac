"""herdscope stats: service response times per protocol and operation."""
import json
from pathlib import Path

import polars as pl

from analyzer import open_capture
from analyzer.cli import ExitCode, main
from analyzer.stats import service_response_times
from fakes import FakeCapture

SAMPLES = Path(__file__).parent.parent / "samples"


def test_dns_stats_agree_with_the_transactions():
    with open_capture(SAMPLES / "dns-retry-storm.pcapng") as cap:
        tx = cap.frame("dns_transactions")
        st = service_response_times(cap)
    row = st.filter(pl.col("operation") == "A").row(0, named=True)
    a = tx.filter(pl.col("operation") == "A")
    assert row["count"] == a.height and row["answered"] == a["answered"].sum()
    assert row["unanswered"] == a.height - a["answered"].sum() > 0  # the storm left queries unanswered
    lat = a.filter(pl.col("answered"))["latency_ns"]
    assert (row["min"], row["max"]) == (lat.min(), lat.max())
    assert row["p99"] in lat.to_list()  # an observed latency, not an interpolation


def _common(n, protocol="smb2", op="CREATE"):
    return pl.DataFrame({
        "protocol": [protocol] * n, "transport": ["tcp"] * n, "flow": [0] * n, "client": ["10.0.0.1"] * n,
        "client_port": [1] * n, "server": ["10.0.0.2"] * n, "server_port": [445] * n, "operation": [op] * n,
        "resource": ["share\\f"] * n, "request_frame": list(range(1, n + 1)), "response_frame": list(range(2, n + 2)),
        "request_ts_ns": [0] * n, "response_ts_ns": [1000 * (k + 1) for k in range(n)],
        "latency_ns": [1000 * (k + 1) for k in range(n)], "status": ["STATUS_SUCCESS"] * n,
        "is_error": [False] * n, "answered": [True] * n,
    })


def test_smb2_pending_waits_and_break_acks_have_rows_of_their_own():
    tx = _common(4).with_columns(pl.Series("pending_ns", [None, 2_000_000_000, None, None], dtype=pl.Int64),
                                 pl.Series("interim_frame", [None, 3, None, None], dtype=pl.UInt32))
    breaks = pl.DataFrame({"break_kind": ["lease_break_notification", "lease_break_notification",
                                          "oplock_break_notification"],
                           "ack_latency_ns": [10_000_000_000, None, 500]})
    cap = FakeCapture(smb2_transactions=tx, smb2_breaks=breaks)
    cap.frame_names = lambda: ["smb2_transactions", "smb2_breaks"]
    st = service_response_times(cap)
    rows = {r["operation"]: r for r in st.iter_rows(named=True)}
    assert rows["CREATE"]["count"] == 4 and rows["CREATE"]["max"] == 4000
    assert rows["STATUS_PENDING wait"]["count"] == 1 and rows["STATUS_PENDING wait"]["max"] == 2_000_000_000
    assert (rows["lease break ack"]["count"], rows["lease break ack"]["unanswered"]) == (2, 1)
    assert rows["oplock break ack"]["p50"] == 500


def test_stats_cli_json_and_exit_codes(capsys, tmp_path):
    assert main(["stats", "--format", "json", str(SAMPLES / "dns-ttl-herd.pcap")]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["stats"][0]["protocol"] == "dns" and doc["stats"][0]["count"] > 200
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"nope")
    assert main(["stats", str(bad)]) == ExitCode.UNREADABLE
