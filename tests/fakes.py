"""A stand-in for ``analyzer.Capture`` holding hand-made frames, for detector tests on tiny
constructed inputs (Zeek's policy-test habit: a few rows, a lowered threshold, an expected finding)."""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.messages import TRANSPORTS, MessageSet

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S  # a whole second: the hand-made frames' time origin


class FakeCapture:
    """``frame(name)`` returns the frames given; ``interfaces`` defaults to one ns-resolution iface."""

    def __init__(self, path: str = "fake.pcap", resolution_ns: float = 1.0, **frames: pl.DataFrame):
        self.path = path
        self.files = [path]
        self._frames = dict(frames)
        self._frames.setdefault("interfaces", pl.DataFrame({
            "iface": [0], "section": [0], "linktype": [1], "snaplen": [0], "ts_resolution_ns": [resolution_ns],
            "ts_offset_s": [0], "name": [None], "linktype_name": ["Ethernet"]},
            schema_overrides={"iface": pl.UInt16, "section": pl.UInt16, "linktype": pl.Int32,
                              "snaplen": pl.UInt32, "name": pl.String}))
        self.buf = np.zeros(0, np.uint8)

    @property
    def packets(self) -> pl.DataFrame:
        return self._frames.get("packets", pl.DataFrame({"frame": [], "ts_ns": []},
                                                        schema={"frame": pl.UInt32, "ts_ns": pl.Int64}))

    def frame(self, name: str) -> pl.DataFrame:
        if name not in self._frames:
            raise KeyError(f"FakeCapture has no frame {name!r}; give it one")
        return self._frames[name]

    def set_frame(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame

    def close(self) -> None:
        pass


def transaction_frame(rows: list[dict], protocol: str = "dns", **extra_cols) -> pl.DataFrame:
    """A transaction frame with the TRANSACTION_COMMON columns from a few dict rows (defaults filled):
    each row needs ``t`` (request time, ns) and ``client``; ``lat``, ``answered``, ``port``, ``server``,
    ``name``, ``op``, ``frame``, ``status``, ``is_error``, ``transport``, ``flow`` are optional, and
    ``extra_cols`` adds protocol columns (a row's value, else the default given)."""
    out = []
    for k, r in enumerate(rows):
        req = r["t"]
        lat = r.get("lat", 100_000)
        answered = r.get("answered", True)
        row = {
            "protocol": protocol, "transport": r.get("transport", "udp"), "flow": r.get("flow", k),
            "client": r["client"], "client_port": r.get("port", 40000 + k), "server": r.get("server", "10.0.0.53"),
            "server_port": r.get("server_port", 53), "operation": r.get("op", "A"),
            "resource": r.get("name", "api.corp.example"), "request_frame": r.get("frame", k + 1),
            "response_frame": (r.get("frame", k + 1) + 100000) if answered else None,
            "request_ts_ns": req, "response_ts_ns": req + lat if answered else None,
            "latency_ns": lat if answered else None, "status": r.get("status", "NOERROR" if answered else None),
            "is_error": r.get("is_error", False) if answered else None, "answered": answered,
        }
        for c, default in extra_cols.items():
            row[c] = r.get(c, default)
        out.append(row)
    return pl.DataFrame(out, schema_overrides={"client_port": pl.UInt16, "server_port": pl.UInt16,
                                               "request_frame": pl.UInt32, "response_frame": pl.UInt32,
                                               "request_ts_ns": pl.Int64, "response_ts_ns": pl.Int64,
                                               "latency_ns": pl.Int64})


# -- SMB2 frames (smb2_breaks, smb2_transactions) ------------------------------------------------------

SMB2_SERVER = "10.0.0.45"
SMB2_SHARE = "\\\\10.0.0.45\\data"
SMB2_FILE = SMB2_SHARE + "\\report.xlsx"


def columns_frame(columns, rows: list[dict]) -> pl.DataFrame:
    """A frame with a decoder's declared columns (analyzer.schema Column list) from dict rows (missing: null)."""
    from analyzer.schema import polars_type

    schema = {c.name: polars_type(c) for c in columns}
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema)


def smb2_tx(client, port, flow, op, t_req, t_resp=None, *, frame_no, path=SMB2_FILE, interim=None,
            status="STATUS_SUCCESS", fid=(1, 1), lease_key=None, resp_frame=None, **extra):
    """An smb2_transactions row: times in ns after T0 (``t_resp`` None: unanswered)."""
    answered = t_resp is not None
    return dict(protocol="smb2", transport="tcp", flow=flow, client=client, client_port=port, server=SMB2_SERVER,
                server_port=445, operation=op, resource=path, request_frame=frame_no,
                response_frame=resp_frame or (frame_no + 1 if answered else None), request_ts_ns=T0 + t_req,
                response_ts_ns=T0 + t_resp if answered else None,
                latency_ns=(t_resp - t_req) if answered else None, status=status if answered else None,
                is_error=False, answered=answered, share=SMB2_SHARE if path else None, path=path,
                fid_persistent=fid[0], fid_volatile=fid[1], interim_frame=interim,
                interim_ts_ns=T0 + t_req + 50_000 if interim else None, pending_by_design=False,
                expects_response=True, lease_key=lease_key, chain_index=0, **extra)


def smb2_break(t, *, frame_no=10, ack=None, kind="oplock", old="batch", new="level2", ack_required=True, flow=0,
               client="10.0.1.1", port=50001, trigger=None, fid=(7, 7), lease_key=None, path=SMB2_FILE):
    """An smb2_breaks row: the notification at T0 + ``t``, acknowledged at T0 + ``ack`` (None: never),
    triggered by the smb2_tx row ``trigger``."""
    row = dict(flow=flow, client=client, client_port=port, server=SMB2_SERVER, server_port=445, frame=frame_no,
               ts_ns=T0 + t, kind=kind, fid_persistent=fid[0] if kind == "oplock" else None,
               fid_volatile=fid[1] if kind == "oplock" else None, lease_key=lease_key, old_state=old,
               new_state=new, ack_required=ack_required, share=SMB2_SHARE, path=path, owner_flow=flow, owner_frame=3)
    if ack is not None:
        row.update(ack_frame=frame_no + 50, ack_ts_ns=T0 + ack, ack_latency_ns=ack - t, ack_state=new,
                   ack_response_frame=frame_no + 51, ack_response_ts_ns=T0 + ack + 100_000,
                   ack_response_status="STATUS_SUCCESS")
    if trigger is not None:
        row.update(trigger_frame=trigger["request_frame"], trigger_flow=trigger["flow"],
                   trigger_client=trigger["client"], trigger_operation=trigger["operation"],
                   trigger_path=trigger["path"], trigger_status=trigger["status"],
                   trigger_response_frame=trigger["response_frame"], trigger_wait_ns=trigger["latency_ns"],
                   trigger_match="blocked" if trigger["answered"] is False or
                   (ack is not None and trigger["response_ts_ns"] >= T0 + ack) else "preceding")
    return row


def smb2_connections(rtt_ns=20_000, flows=8, client_packets=10):
    """A connections frame of ``flows`` connections with the given RTT."""
    return pl.DataFrame({"conn": list(range(flows)), "handshake_rtt_ns": [rtt_ns] * flows,
                         "rtt_client_server_ns": [rtt_ns // 2] * flows, "rtt_server_client_ns": [rtt_ns // 2] * flows,
                         "client_packets": [client_packets] * flows, "server_packets": [10] * flows},
                        schema_overrides={"conn": pl.UInt32, "client_packets": pl.UInt32, "server_packets": pl.UInt32})


def smb2_capture(breaks, txs, *, end=None, rtt_ns=20_000, client_packets=10, resolution_ns=1.0):
    """A FakeCapture of smb2_breaks and smb2_transactions rows (plus the holder's quick everyday requests),
    connections and packets spanning the capture (to ``end`` ns after T0, else the last time given)."""
    last = end if end is not None else max([r["ts_ns"] for r in breaks] + [r["response_ts_ns"] or r["request_ts_ns"]
                                                                            for r in txs]) - T0
    packets = pl.DataFrame({"frame": [1, 99999], "ts_ns": [T0, T0 + last]},
                           schema={"frame": pl.UInt32, "ts_ns": pl.Int64})
    # the holder's quick everyday requests give the server's median response time
    from analyzer.decoders.smb2_pairing import BREAK_COLUMNS, TRANSACTION_COLUMNS

    base = [smb2_tx("10.0.1.1", 50001, 0, "READ", k * MS, k * MS + 200_000, frame_no=1000 + 2 * k, fid=(7, 7))
            for k in range(5)]
    return FakeCapture(resolution_ns=resolution_ns, smb2_breaks=columns_frame(BREAK_COLUMNS, breaks),
                       smb2_transactions=columns_frame(TRANSACTION_COLUMNS, base + txs),
                       connections=smb2_connections(rtt_ns, client_packets=client_packets), packets=packets)


# -- message sets (the decoders' input) -------------------------------------------------------------

def message_set(messages, *, transport="udp", flows=None, from_client=None, ts=None, frames=None,
                wire_lengths=None, sport=50000, dport=88) -> MessageSet:
    """A MessageSet over byte literals: one message per item, consecutive in one buffer (with a
    guard byte between them so that reading past a message's end would be noticed)."""
    n = len(messages)
    buf = bytearray()
    offsets = []
    for m in messages:
        offsets.append(len(buf))
        buf += m + b"\xEE"
    flows = flows if flows is not None else [0] * n
    from_client = from_client if from_client is not None else [True] * n
    ts = ts if ts is not None else [1_000_000_000 * (k + 1) for k in range(n)]
    frames = frames if frames is not None else list(range(1, n + 1))
    lengths = [len(m) for m in messages]
    wire = wire_lengths if wire_lengths is not None else lengths
    fc = list(from_client)
    frame = pl.DataFrame({
        "transport": pl.Series([transport] * n, dtype=TRANSPORTS),
        "flow": pl.Series(flows, dtype=pl.UInt32),
        "from_client": pl.Series(fc, dtype=pl.Boolean),
        "src": pl.Series(["10.0.0.1" if c else "10.0.0.2" for c in fc], dtype=pl.String),
        "dst": pl.Series(["10.0.0.2" if c else "10.0.0.1" for c in fc], dtype=pl.String),
        "sport": pl.Series([sport if c else dport for c in fc], dtype=pl.UInt16),
        "dport": pl.Series([dport if c else sport for c in fc], dtype=pl.UInt16),
        "frame_first": pl.Series(frames, dtype=pl.UInt32),
        "frame_last": pl.Series(frames, dtype=pl.UInt32),
        "ts_first_ns": pl.Series(ts, dtype=pl.Int64),
        "ts_last_ns": pl.Series(ts, dtype=pl.Int64),
        "offset": pl.Series(offsets, dtype=pl.Int64),
        "length": pl.Series(lengths, dtype=pl.UInt32),
        "wire_length": pl.Series(wire, dtype=pl.UInt32),
        "complete": pl.Series([a == b for a, b in zip(lengths, wire)], dtype=pl.Boolean),
    })
    return MessageSet(frame, np.frombuffer(bytes(buf), np.uint8))
