"""ONC-RPC record marking over TCP (RFC 5531 §11): the "rpc_record_mark" framing of analyzer.tcp.framing,
on constructed streams: one fragment per record, several fragments across segments, gaps, hostile marks."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.tcp import framing
from analyzer.tcp import tcp_messages
from builders import handshake, stream_steps as steps_for, tcp_conversation
from tshark_ref import as_int, as_list, have_tshark, tshark_fields

US = 1_000
NFS = ("10.0.0.2", 2049)
LAST = 0x80000000


def rpc_call(xid: int, args: bytes = b"", prog=100003, vers=3, proc=1) -> bytes:
    """A CALL (RFC 5531 §9): xid, msg_type 0, rpcvers 2, program, version, procedure, AUTH_NONE
    credential and verifier, then the arguments."""
    return struct.pack(">IIIIIIIIII", xid, 0, 2, prog, vers, proc, 0, 0, 0, 0) + args


def rpc_reply(xid: int, results: bytes = b"") -> bytes:
    """An accepted REPLY: xid, msg_type 1, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS, results."""
    return struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0) + results


def record(message: bytes, cuts=()) -> bytes:
    """``message`` as one record, split into fragments at ``cuts`` (offsets into the message)."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(message))), len(message)]
    out = b""
    for k in range(len(bounds) - 1):
        piece = message[bounds[k]:bounds[k + 1]]
        out += struct.pack(">I", len(piece) | (LAST if k == len(bounds) - 2 else 0)) + piece
    return out


def frame_rpc(read_capture, steps, **kw):
    cap = read_capture(tcp_conversation(steps, server=NFS))
    sets = tcp_messages(cap, "rpc_record_mark", {2049}, **kw)
    return cap, sets


def bodies(sets):
    return [s.message_bytes(k) for s in sets for k in range(s.height)]


def test_one_fragment_per_record_several_records_per_segment(read_capture):
    msgs = [rpc_call(k, b"a" * (4 * k)) for k in range(1, 4)]
    stream = b"".join(record(m) for m in msgs)
    _, sets = frame_rpc(read_capture, handshake() + steps_for(stream))
    assert bodies(sets) == msgs
    f = sets[0].frame
    assert f["complete"].all() and f["from_client"].all()
    assert f["wire_length"].to_list() == [len(m) for m in msgs]
    assert f["frame_first"].to_list() == [4, 4, 4] and f["frame_last"].to_list() == [4, 4, 4]


def test_several_fragments_across_segments_assemble_into_one_message(read_capture):
    msg = rpc_call(7, bytes(range(200)))
    stream = record(msg, cuts=[10, 11, 150])  # four fragments; segment cuts inside marks and bodies
    seg_cuts = [2, 30, 31, 100, len(stream) - 3]
    steps = handshake() + steps_for(stream, seg_cuts)
    cap, sets = frame_rpc(read_capture, steps)
    assert bodies(sets) == [msg]
    f = sets[0].frame
    assert f["complete"][0] and f["wire_length"][0] == len(msg) and f["length"][0] == len(msg)
    # the first mark is in the first data segment (frame 4), the last byte in the last (frame 4 + 5)
    assert (f["frame_first"][0], f["frame_last"][0]) == (4, 9)
    ts = dict(zip(cap.packets["frame"].to_list(), cap.packets["ts_ns"].to_list()))
    assert (f["ts_first_ns"][0], f["ts_last_ns"][0]) == (ts[4], ts[9])


def test_replies_frame_in_their_own_direction(read_capture):
    call, reply = rpc_call(9, b"x" * 8), rpc_reply(9, b"y" * 12)
    steps = (handshake() + steps_for(record(call))
             + steps_for(record(reply, cuts=[5]), server=True, t0=500 * US))
    _, sets = frame_rpc(read_capture, steps)
    f = sets[0].frame.sort("frame_first")
    assert f["from_client"].to_list() == [True, False]
    assert sorted(bodies(sets)) == sorted([call, reply])


def test_max_copy_keeps_the_head_and_the_wire_length(read_capture):
    msg = rpc_call(3, b"d" * 3000)
    stream = record(msg, cuts=[40, 1000, 2000])
    _, sets = frame_rpc(read_capture, handshake() + steps_for(stream, [500, 1500]), max_copy=100)
    f = sets[0].frame
    assert f["length"][0] == 100 and f["wire_length"][0] == len(msg) and f["complete"][0]
    assert bodies(sets) == [msg[:100]]


def test_gap_inside_a_fragment_stops_the_copy_and_framing_goes_on(read_capture):
    first, second = rpc_call(1, b"p" * 300), rpc_call(2, b"q" * 20)
    rec1 = record(first, cuts=[100])  # fragment 1: bytes 4..104 of the stream, fragment 2 after it
    stream = rec1 + record(second)
    # lose stream bytes 150..200, inside the second fragment's body: its length is known, so the next
    # record is found where the marks say
    steps = handshake() + steps_for(stream, [150, 200], skip={1})
    _, sets = frame_rpc(read_capture, steps)
    f = sets[0].frame
    assert f["complete"].to_list() == [False, True]
    assert f["wire_length"][0] == len(first)
    got = bodies(sets)
    assert got[0] == first[:150 - 8]  # the two marks are not part of the message
    assert got[1] == second
    assert sets[0].stats["resyncs"].sum() == 0


def test_lost_mark_ends_the_record_unfinished_and_resynchronises(read_capture):
    first, second = rpc_call(1, b"p" * 100), rpc_call(2, b"q" * 20)
    rec1 = record(first, cuts=[50])
    mark2 = 4 + 50  # the second fragment's mark
    stream = rec1 + record(second)
    steps = handshake() + steps_for(stream, [mark2, mark2 + 30, len(rec1)], skip={1})
    _, sets = frame_rpc(read_capture, steps)
    f = sets[0].frame
    assert f.height == 2
    assert f["complete"].to_list() == [False, True]
    assert bodies(sets) == [first[:50], second]
    assert sets[0].stats["resyncs"].sum() == 1


def test_a_record_that_never_ends_is_an_incomplete_message(read_capture):
    msg = rpc_call(5, b"z" * 40)
    frag = struct.pack(">I", len(msg)) + msg  # last-fragment bit never set
    _, sets = frame_rpc(read_capture, handshake() + steps_for(frag))
    f = sets[0].frame
    assert f.height == 1 and not f["complete"][0]
    assert bodies(sets) == [msg]


def test_zero_length_fragments_are_bounded(read_capture):
    msg = rpc_call(6, b"k" * 8)
    # a few zero-length fragments before the real one are legal and add nothing
    stream = struct.pack(">I", 0) * 3 + record(msg)
    _, sets = frame_rpc(read_capture, handshake() + steps_for(stream))
    assert bodies(sets) == [msg] and sets[0].frame["complete"][0]
    # a stream of nothing but zero-length fragments: MAX_RPC_FRAGMENTS of them end a record there,
    # unfinished; what follows is no record start (a zero-length fragment cannot hold an RPC header) and
    # no later segment starts one, so framing gives up on the rest (bounded work, one empty message)
    n = framing.MAX_RPC_FRAGMENTS + 10
    hostile = struct.pack(">I", 0) * n
    _, sets = frame_rpc(read_capture, handshake() + steps_for(hostile, range(1400, len(hostile), 1400)))
    f, stats = sets[0].frame, sets[0].stats
    assert f.height == 1 and not f["complete"][0] and f["wire_length"][0] == 0
    assert stats["gave_up"].any() and stats["skipped_bytes"].sum() == 10 * 4


def test_rest_of_an_unfinished_record_is_not_a_new_record(read_capture):
    """A record stopped at MAX_RPC_FRAGMENTS without its last fragment: the fragment after it is the
    same record's, not a new one, so it is framed only if it looks like a call or reply; here it does
    not (its "msg_type" is 0xdeadbeef) and framing resynchronises at the next segment's real call."""
    good = rpc_call(9, b"g" * 16)
    hostile = struct.pack(">I", 0) * framing.MAX_RPC_FRAGMENTS
    tail = struct.pack(">I", LAST | 40) + b"\xde\xad\xbe\xef" * 10
    stream = hostile + tail + record(good)
    cuts = [*range(1400, len(hostile), 1400), len(hostile + tail)]
    _, sets = frame_rpc(read_capture, handshake() + steps_for(stream, cuts))
    f, stats = sets[0].frame, sets[0].stats
    assert f.height == 2 and not f["complete"][0] and f["wire_length"][0] == 0
    assert sets[0].message_bytes(1) == good and f["complete"][1]
    assert not any(b.startswith(b"\xde\xad\xbe\xef") for b in bodies(sets))
    assert stats["resyncs"].sum() == 1 and stats["skipped_bytes"].sum() == len(tail) and not stats["gave_up"].any()
    # with nothing after the tail the rest of the direction is given up, not framed
    _, sets = frame_rpc(read_capture, handshake() + steps_for(hostile + tail, cuts[:-1]))
    f, stats = sets[0].frame, sets[0].stats
    assert f.height == 1 and not f["complete"][0]
    assert stats["gave_up"].any() and stats["skipped_bytes"].sum() == len(tail)


def test_implausible_fragment_length_is_not_a_record(read_capture):
    good = rpc_call(8, b"g" * 12)
    bogus = struct.pack(">I", LAST | (framing.MAX_RPC_FRAGMENT + 1)) + b"\0" * 60
    steps = handshake() + steps_for(bogus + record(good), [len(bogus)])
    _, sets = frame_rpc(read_capture, steps)
    assert bodies(sets) == [good]
    assert sets[0].stats["resyncs"].sum() == 1 and sets[0].stats["skipped_bytes"].sum() == len(bogus)


def test_many_small_records_in_one_segment_all_framed(read_capture):
    """More messages than the first guess of room (two per segment): framing is redone with more."""
    msgs = [rpc_reply(k) for k in range(500)]
    stream = b"".join(record(m) for m in msgs)
    _, sets = frame_rpc(read_capture, handshake() + steps_for(stream, [len(stream) // 2]))
    assert bodies(sets) == msgs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 400), min_size=1, max_size=5), data=st.data())
def test_property_any_fragmentation_and_segmentation_reassembles(read_capture, sizes, data):
    msgs = [rpc_call(k, bytes([k]) * n) for k, n in enumerate(sizes)]
    stream = b""
    for m in msgs:
        cuts = data.draw(st.lists(st.integers(1, len(m) - 1), max_size=4))
        stream += record(m, cuts)
    seg_cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=10))
    _, sets = frame_rpc(read_capture, handshake() + steps_for(stream, seg_cuts))
    assert bodies(sets) == msgs
    assert sets[0].frame["complete"].all()


@pytest.mark.tshark
def test_rpc_messages_agree_with_tshark(read_capture, tmp_path):
    """A constructed NFS-port conversation (calls and replies, some in several fragments, segments cut
    through marks and bodies): the messages framed, their xid, msg_type and the frame where each ends
    are tshark's ``rpc`` messages (RPC-over-TCP reassembly, decode-as rpc on 2049)."""
    if not have_tshark():
        pytest.fail("tshark is not installed (it is part of the test environment)")
    calls = [rpc_call(0x100 + k, bytes([k]) * (60 + 50 * k), proc=0) for k in range(4)]
    replies = [rpc_reply(0x100 + k, bytes([k]) * (20 + 30 * k)) for k in range(4)]
    c = b"".join(record(m, cuts=[17, 40] if k % 2 else []) for k, m in enumerate(calls))
    r = b"".join(record(m, cuts=[30] if k % 2 == 0 else []) for k, m in enumerate(replies))
    steps = (handshake() + steps_for(c, [5, 70, 71, 200, 333])
             + steps_for(r, [9, 100], server=True, t0=900 * US))
    data = tcp_conversation(steps, server=NFS)
    path = tmp_path / "rpc.pcap"
    path.write_bytes(data)
    ref = tshark_fields(path, ["frame.number", "rpc.xid", "rpc.msgtyp"], display_filter="rpc",
                        extra_args=["-d", "tcp.port==2049,rpc"])
    ref = ref.with_columns(as_int("frame.number"), as_list("rpc.xid"), as_list("rpc.msgtyp"))
    theirs = sorted((f, int(x, 16), int(t)) for f, xs, ts in ref.iter_rows() for x, t in zip(xs, ts))
    cap = read_capture(data)
    sets = tcp_messages(cap, "rpc_record_mark", {2049})
    ours = sorted((int(s.frame["frame_last"][k]), *struct.unpack(">II", s.message_bytes(k)[:8]))
                  for s in sets for k in range(s.height))
    assert len(ours) == 8 and ours == theirs
    assert all(s.frame["complete"].all() for s in sets)
