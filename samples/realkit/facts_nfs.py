"""What tshark sees in the NFS samples (see realkit/facts.py: a fact per scenario, a tolerance each):
NFS clients, calls and replies, and per scenario the opens, locks, retransmissions (tshark's
rpc.call.dup / rpc.reply.dup), delegation recalls and NFSv4.1 slots."""
from __future__ import annotations

from .facts import FACTS, TOLERANCE, max_distinct_in_window, tshark_rows

NFS4_OP_LOOKUP, NFS4_OP_OPEN, NFS4_OP_LOCK, NFS4_OP_LOCKU = "15", "18", "12", "14"
NFS4ERR_DENIED = "10010"


def _nfs_messages(path) -> list[dict]:
    """ONC-RPC messages carrying NFS (calls and replies; several per frame possible on TCP): time,
    source, message type, the NFSv4 operations of a COMPOUND, the NFSv3 procedure, the NFSv4 status."""
    rows = tshark_rows(path, "nfs", ["frame.time_relative", "ip.src", "rpc.msgtyp", "nfs.opcode",
                                     "nfs.procedure_v3", "nfs.nfsstat4"])
    out = []
    for t, src, mt, ops, proc, st in rows:
        for k, m in enumerate(mt.split(",")):
            out.append(dict(t=float(t), src=src, call=m == "0", ops=ops.split(",") if ops and k == 0 else [],
                            proc=proc, status=st.split(",")))
    return out


def _nfs_common(path) -> dict:
    msgs = _nfs_messages(path)
    calls = [m for m in msgs if m["call"]]
    return dict(nfs_clients=len({m["src"] for m in calls}), nfs_calls=len(calls),
                nfs_replies=len(msgs) - len(calls),
                malformed=len(tshark_rows(path, "_ws.malformed", ["frame.number"]))), calls, msgs


def nfs4_open_herd(path) -> dict:
    f, calls, _ = _nfs_common(path)
    opens = [(m["t"], m["src"]) for m in calls if NFS4_OP_OPEN in m["ops"]]
    f.update(open_calls=len(opens), lookup_calls=sum(1 for m in calls if NFS4_OP_LOOKUP in m["ops"]),
             opening_clients=len({s for _, s in opens}),
             max_clients_opening_in_100ms=max_distinct_in_window(opens, 0.1))
    return f


def nfs4_lock_polling(path) -> dict:
    f, calls, msgs = _nfs_common(path)
    f.update(lock_calls=sum(1 for m in calls if NFS4_OP_LOCK in m["ops"]),
             locku_calls=sum(1 for m in calls if NFS4_OP_LOCKU in m["ops"]),
             lock_denied_replies=sum(1 for m in msgs if not m["call"] and NFS4ERR_DENIED in m["status"]),
             locking_clients=len({m["src"] for m in calls if NFS4_OP_LOCK in m["ops"]}))
    return f


def nfs3_udp_retrans(path) -> dict:
    f, calls, _ = _nfs_common(path)
    f.update(read_calls=sum(1 for m in calls if m["proc"] == "6"),
             duplicate_calls=len(tshark_rows(path, "rpc.call.dup", ["frame.number"])),
             duplicate_replies=len(tshark_rows(path, "rpc.reply.dup", ["frame.number"])))
    return f


FACTS["nfs4-open-herd"] = nfs4_open_herd
FACTS["nfs4-lock-polling"] = nfs4_lock_polling
FACTS["nfs4-lock-polling-growing"] = nfs4_lock_polling
FACTS["nfs3-udp-retrans"] = nfs3_udp_retrans
TOLERANCE["nfs4-open-herd"] = dict(nfs_clients=0, nfs_calls=6, nfs_replies=6, malformed=0, open_calls=0,
                                   lookup_calls=0, opening_clients=0, max_clients_opening_in_100ms=10)
TOLERANCE["nfs4-lock-polling"] = dict(nfs_clients=0, nfs_calls=25, nfs_replies=25, malformed=0, lock_calls=20,
                                      locku_calls=0, lock_denied_replies=20, locking_clients=0)
TOLERANCE["nfs4-lock-polling-growing"] = dict(nfs_clients=0, nfs_calls=8, nfs_replies=8, malformed=0, lock_calls=5,
                                              locku_calls=1, lock_denied_replies=5, locking_clients=0)
TOLERANCE["nfs3-udp-retrans"] = dict(nfs_clients=0, nfs_calls=25, nfs_replies=25, malformed=0, read_calls=25,
                                     duplicate_calls=4, duplicate_replies=4)


NFS4_OP_DELEGRETURN, NFS4ERR_DELAY, CB_OP_RECALL = "8", "10008", "4"


def nfs4_delegation_recall(path) -> dict:
    """CB_RECALL calls (tshark's nfs.cb.operation on the callback connection), DELEGRETURNs, and the
    OPENs answered NFS4ERR_DELAY."""
    f, calls, msgs = _nfs_common(path)
    f.update(open_calls=sum(1 for m in calls if NFS4_OP_OPEN in m["ops"]),
             delegreturn_calls=sum(1 for m in calls if NFS4_OP_DELEGRETURN in m["ops"]),
             delay_replies=sum(1 for m in msgs if not m["call"] and NFS4ERR_DELAY in m["status"]),
             cb_recall_calls=len(tshark_rows(path, f"nfs.cb.operation == {CB_OP_RECALL} && rpc.msgtyp == 0",
                                             ["frame.number"])))
    return f


def nfs41_saturation(path) -> dict:
    """SEQUENCE calls and the sessions and slots they use (nfs.session_id4, nfs.slotid)."""
    f, calls, _ = _nfs_common(path)
    seq = tshark_rows(path, "nfs.session_id4 && rpc.msgtyp == 0", ["nfs.session_id4", "nfs.slotid"])
    # a frame may carry several calls: tshark joins their values with commas
    pairs = [p for s, k in seq if k for p in zip(s.split(","), k.split(","))]  # DESTROY_SESSION: no slot
    f.update(sequence_calls=len(pairs), sessions=len({s for s, _ in pairs}), slots_used=len(set(pairs)))
    return f


FACTS["nfs4-delegation-recall"] = nfs4_delegation_recall
FACTS["nfs41-saturation"] = nfs41_saturation
TOLERANCE["nfs4-delegation-recall"] = dict(nfs_clients=0, nfs_calls=12, nfs_replies=12, malformed=0, open_calls=6,
                                           delegreturn_calls=0, delay_replies=6, cb_recall_calls=0)
TOLERANCE["nfs41-saturation"] = dict(nfs_clients=0, nfs_calls=400, nfs_replies=400, malformed=0,
                                     sequence_calls=400, sessions=0, slots_used=8)
