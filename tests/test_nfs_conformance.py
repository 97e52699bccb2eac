"""ONC-RPC / NFS decoder against tshark, field by field, on Zeek's NFSv3, MOUNT and PORTMAP traces
(tests/data/nfs/README.md: source and licence) and on the recorded NFSv4 captures when present.

Per frame carrying RPC on our ports (111, 2049, 20048), the nfs_messages row of that message
(op_index 0) against tshark's first occurrence of each field. Deliberate differences:

- ``rpc.auth.flavor`` on a reply is the verifier's flavour in tshark; our ``auth_flavor`` is the
  call's credential flavour only (compared on calls).
- ``nfs.fh.hash`` / ``nfs.name``: tshark's first occurrence in a reply can be an entry of a
  READDIRPLUS listing; we keep the handle a reply returns for its object (LOOKUP, CREATE, MKDIR,
  SYMLINK, MKNOD, MOUNT MNT), so replies are compared where we report one.
- ``rpc.repframe``: for a reply to a retransmitted call tshark names the first call; our ``call_frame``
  names the latest call before the reply, so it is mapped to the transaction's first call first.
- Frames with more than one RPC message (several records in one TCP segment) aggregate in tshark:
  skipped and counted.
- MOUNT on a port other than 20048 and other RPC programs on their own ports are not decoded (the
  declaration lists 111, 2049, 20048): those frames are counted, not compared.
"""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyzer.capture import open_capture
from tshark_ref import as_hex_int, as_int, have_tshark, tshark_fields

DATA = Path(__file__).parent / "data" / "nfs"
ZEEK = ["zeek-nfs_base.pcap", "zeek-nfs_write.pcap", "zeek-nfs_fsinfo_bad_status.pcap", "zeek-mount-unmount.pcap",
        "zeek-rpc-portmap-sadmind.pcap"]
RECORDED = sorted(p.name for p in (DATA / "recorded").glob("*.pcap*")) if (DATA / "recorded").is_dir() else []
SAMPLES = Path(__file__).parent.parent / "samples"
# the recorded NFS samples (samples/MANIFEST.toml; nfs-ganesha with Gluster or VFS, NFSv3/4.0/4.1)
SAMPLE_NFS = sorted(p.name for p in SAMPLES.glob("nfs*.pcap*"))


def _path(name: str) -> Path:
    """Where a capture of these tests lives: the Zeek traces, tests/data/nfs/recorded, or samples/."""
    if name in ZEEK:
        return DATA / name
    return DATA / "recorded" / name if name in RECORDED else SAMPLES / name

pytestmark = [pytest.mark.tshark, pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]

RPC_FIELDS = {"rpc.xid": "xid", "rpc.msgtyp": "msg_type_code", "rpc.program": "program",
              "rpc.programversion": "version", "rpc.procedure": "procedure", "rpc.replystat": "reply_stat",
              "rpc.state_accept": "accept_stat"}
CALL_FIELDS = {"rpc.auth.flavor": "auth_flavor", "rpc.auth.uid": "auth_uid", "rpc.auth.gid": "auth_gid",
               "rpc.auth.machinename": "machine", "nfs.fh.hash": "fh_hash", "nfs.name": "name"}
REPLY_FIELDS = {"rpc.repframe": "call_frame", "nfs.status": "nfs_status", "mount.status": "nfs_status"}
PORTS_FILTER = "rpc && (" + " || ".join(f"tcp.port == {p} || udp.port == {p}" for p in (111, 2049, 20048)) + ")"
TEXT = {"rpc.auth.machinename", "nfs.name"}
HEX = {"rpc.xid", "nfs.fh.hash"}


def _ours(path: Path) -> pl.DataFrame:
    m = open_capture(path).frame("nfs_messages").filter(pl.col("op_index") == 0)
    return m.with_columns((pl.col("msg_type") == "REPLY").cast(pl.Int64).alias("msg_type_code"))


def _theirs(path: Path, frames: list[int]) -> pl.DataFrame:
    fields = ["frame.number", *RPC_FIELDS, *CALL_FIELDS, *REPLY_FIELDS]
    ref = tshark_fields(path, fields, display_filter="rpc", occurrence="f")
    n = tshark_fields(path, ["frame.number", "rpc.xid"], display_filter="rpc", occurrence="a")
    single = n.filter(~pl.col("rpc.xid").str.contains(",")).select(as_int("frame.number"))
    ref = ref.with_columns(as_int("frame.number")).join(single, on="frame.number")
    conv = [as_hex_int(f) if f in HEX else (pl.col(f) if f in TEXT else as_int(f)) for f in fields[1:]]
    return ref.with_columns(conv).filter(pl.col("frame.number").is_in(frames))


def _first_call_frames(path: Path, ours: pl.DataFrame) -> pl.DataFrame:
    """A reply's call_frame mapped to the first call of its transaction: tshark's rpc.repframe names the
    first call when the call was retransmitted (same xid), we name the latest one before the reply."""
    tx = open_capture(path).frame("nfs_transactions").filter(pl.col("retransmissions") > 0).select(
        "flow", "xid", "request_frame", "last_call_frame")
    if tx.height == 0:
        return ours
    hit = ours.select("frame_last", "flow", "xid", "call_frame").join(tx, on=["flow", "xid"]).filter(
        pl.col("call_frame").is_between(pl.col("request_frame"), pl.col("last_call_frame"))) \
        .select("frame_last", pl.col("request_frame").alias("_first"))
    return ours.join(hit, on="frame_last", how="left").with_columns(
        pl.coalesce("_first", "call_frame").alias("call_frame")).drop("_first")


def compare(path: Path) -> dict:
    ours = _ours(path)
    ours = _first_call_frames(path, ours)
    counts = ours.group_by("frame_last").len()
    ours = ours.join(counts.filter(pl.col("len") == 1).select("frame_last"), on="frame_last")
    ref = _theirs(path, ours["frame_last"].to_list())
    joined = ours.join(ref, left_on="frame_last", right_on="frame.number", how="inner")
    mismatches, compared = [], 0
    calls = pl.col("msg_type") == "CALL"
    checks = [(RPC_FIELDS, pl.lit(True)), (CALL_FIELDS, calls), (REPLY_FIELDS, ~calls)]
    for table, where in checks:
        for theirs, mine in table.items():
            rows = joined.filter(where)
            if table is CALL_FIELDS and theirs in ("nfs.fh.hash", "nfs.name"):
                # NFSv3's one handle and name per call; NFSv4's are per COMPOUND operation (compare_v4: the
                # first occurrence is not the first operation's when SEQUENCE leads, as in 4.1)
                rows = rows.filter((pl.col("program") == 100003) & (pl.col("version") != 4))
            if theirs == "mount.status":
                rows = rows.filter(pl.col("program") == 100005)
            elif theirs == "nfs.status":
                rows = rows.filter(pl.col("program") == 100003)
            rows = rows.filter(pl.col(theirs).is_not_null() | pl.col(mine).is_not_null())
            a = rows[mine].cast(pl.String)
            b = rows[theirs].cast(pl.String)
            bad = rows.filter(a.ne_missing(b).to_numpy())
            compared += rows.height
            mismatches += [(theirs, f, x, y) for f, x, y in zip(bad["frame_last"], bad[mine], bad[theirs])]
    return {"frames": joined.height, "ours": ours.height, "ref": ref.height, "compared": compared,
            "mismatches": mismatches}


@pytest.mark.parametrize("name", ZEEK + RECORDED + SAMPLE_NFS)
def test_rpc_and_nfs_fields_match_tshark(name):
    got = compare(_path(name))
    assert got["frames"] > 0 and got["frames"] == got["ours"], got
    assert got["mismatches"] == [], got["mismatches"][:20]


def test_every_rpc_frame_on_our_ports_is_decoded():
    """Every frame tshark calls RPC on 111/2049/20048 has a row (nothing silently dropped)."""
    for name in ZEEK:
        path = DATA / name
        ref = tshark_fields(path, ["frame.number"], display_filter=PORTS_FILTER)
        frames = set(as_int(ref["frame.number"]).to_list())
        ours = set(open_capture(path).frame("nfs_messages")["frame_last"].to_list())
        assert frames <= ours, (name, sorted(frames - ours)[:10])


# --- NFSv4: per operation (the recorded captures) ------------------------------------------------------

V4_LISTS = {"nfs.opcode": "opcode", "nfs.nfsstat4": "statuses", "nfs.fh.hash": "fh_hash",
            "nfs.pathname.component": "name", "nfs.locktype4": "lock_code", "nfs.offset4": "lock_offset",
            "nfs.length4": "lock_length", "nfs.clientid": "clientid", "nfs.slotid": "slotid",
            "nfs.high_slotid": "highest_slotid", "nfs.target_high_slotid": "target_highest_slotid"}
_LOCK_CODES = {"READ_LT": 1, "WRITE_LT": 2, "READW_LT": 3, "WRITEW_LT": 4}


def _our_v4_lists(path: Path) -> pl.DataFrame:
    """Per COMPOUND message: our values in wire order, as tshark lists them (occurrence=a).
    tshark's nfs.nfsstat4 is the COMPOUND status then each operation's; nfs.offset4/length4/locktype4
    are the LOCK/LOCKT/LOCKU arguments in a call (offset4 also READ/WRITE/COMMIT's) and the LOCK4denied
    fields in a reply; clientid every one the COMPOUND carries (owners, SETCLIENTID, the holder's)."""
    m = open_capture(path).frame("nfs_messages").filter((pl.col("program") == 100003) & (pl.col("version") == 4)
                                                        & pl.col("opcode").is_not_null())
    lock_ops = pl.col("operation").is_in(["LOCK", "LOCKT", "LOCKU"])
    is_call = pl.col("msg_type") == "CALL"
    m = m.with_columns(
        pl.when(pl.col("operation").is_in(["LOOKUP", "OPEN"])).then(pl.col("name")).alias("name"),
        pl.when(lock_ops & is_call).then(pl.col("lock_type")).otherwise(pl.col("denied_type"))
        .replace_strict(_LOCK_CODES, default=None, return_dtype=pl.Int64).alias("lock_code"),
        pl.when(is_call).then(pl.col("offset")).otherwise(pl.col("denied_offset")).alias("lock_offset"),
        pl.when(lock_ops & is_call).then(pl.col("length")).otherwise(pl.col("denied_length")).alias("lock_length"),
    )
    g = m.sort("message", "op_index").group_by("message", maintain_order=True).agg(
        pl.col("frame_last").first(), pl.col("msg_type").first(), pl.col("nfs_status").first(),
        pl.col("op_status"), *[pl.col(c).drop_nulls() for c in V4_LISTS.values() if c != "statuses"])
    return g.with_columns(pl.when(pl.col("msg_type") == "REPLY").then(
        pl.concat_list([pl.col("nfs_status").cast(pl.Int64), pl.col("op_status").list.eval(pl.element().cast(pl.Int64))]))
        .alias("statuses"))


def compare_v4(path: Path) -> dict:
    ours = _our_v4_lists(path)
    single = ours.group_by("frame_last").len().filter(pl.col("len") == 1).select("frame_last")
    ours = ours.join(single, on="frame_last")
    ref = tshark_fields(path, ["frame.number", *V4_LISTS], display_filter="nfs", occurrence="a")
    ref = ref.with_columns(as_int("frame.number"))
    joined = ours.join(ref, left_on="frame_last", right_on="frame.number", how="inner")
    mismatches, compared = [], 0
    for theirs, mine in V4_LISTS.items():
        for frame, a, b in zip(joined["frame_last"].to_list(), joined[mine].to_list(), joined[theirs].to_list()):
            fmt = {"nfs.fh.hash": "0x{:08x}", "nfs.clientid": "0x{:016x}"}.get(theirs, "{}")
            mine_list = [fmt.format(v) for v in (a or [])]
            their_list = [] if b is None else b.split(",")
            compared += 1
            if mine_list != their_list:
                mismatches.append((theirs, frame, mine_list, their_list))
    return {"messages": joined.height, "compared": compared, "mismatches": mismatches}


@pytest.mark.parametrize("name", RECORDED + SAMPLE_NFS)
def test_nfs4_operations_match_tshark(name):
    got = compare_v4(_path(name))
    if got["messages"] == 0:
        pytest.skip("no NFSv4 COMPOUND in this capture")
    assert got["mismatches"] == [], got["mismatches"][:10]


def _ground_truth() -> dict:
    path = DATA / "recorded" / "GROUNDTRUTH.toml"
    if not path.is_file():
        return {}
    import tomllib
    captures = tomllib.loads(path.read_text()).get("capture", {})
    return {c["file"]: c for c in captures} if isinstance(captures, list) else captures


@pytest.mark.parametrize("name", [n for n in RECORDED if n in _ground_truth()])
def test_recorded_ground_truth_in_the_transactions(name):
    """The counts helper N2 wrote down when recording (GROUNDTRUTH.toml), from nfs_transactions."""
    truth = _ground_truth()[name]
    tx = open_capture(DATA / "recorded" / name).frame("nfs_transactions")
    locks = tx.filter(pl.col("operation") == "LOCK")
    if "lock_attempts" in truth:
        assert locks.height == truth["lock_attempts"]
        assert (locks["status"] == "NFS4ERR_DENIED").sum() == truth["lock_denials"]
        denied = locks.filter(pl.col("status") == "NFS4ERR_DENIED")
        assert denied["denied_owner"].null_count() == 0 and denied["resource"].str.ends_with(".lock").all()
    if "opens" in truth:
        opens = tx.filter(pl.col("operation") == "OPEN")
        assert opens.height == truth["opens"] and opens["resource"].unique().to_list() == [truth["path"]]
    if "clients" in truth:
        assert tx["client"].n_unique() == truth["clients"]
    expected = truth.get("retransmissions", truth.get("tshark", {}).get("rpc_retransmissions", 0))
    assert tx["retransmissions"].sum() == expected
    if "calls_retransmitted" in truth:
        assert (tx["retransmissions"] > 0).sum() == truth["calls_retransmitted"]
