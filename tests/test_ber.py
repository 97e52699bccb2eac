"""The shared BER/DER reader (analyzer.decoders.ber), X.690 edge cases byte by byte.

The DER builders are in tests/builders.py, the MessageSet builder in tests/fakes.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from analyzer.decoders import ber
from builders import integer, octets, seq, tlv


def _arr(b: bytes) -> np.ndarray:
    return np.frombuffer(b, np.uint8)


def read(b: bytes, pos=0, end=None, mend=None):
    end = len(b) if end is None else end
    mend = end if mend is None else mend
    return tuple(int(x) for x in ber.read_tlv(_arr(b), pos, end, mend))


# --- tags ---------------------------------------------------------------------------------------------

def test_low_tag_number_form():
    t, s, e, status = read(bytes.fromhex("3003020105"))
    assert (t, s, e, status) == (int(ber.SEQUENCE), 2, 5, ber.OK)
    assert ber.tag_class(t) == 0x20 and ber.tag_number(t) == 16
    assert read(bytes.fromhex("6a00"))[0] == int(ber.app(10))
    assert read(bytes.fromhex("a100"))[0] == int(ber.ctx(1))
    assert read(bytes.fromhex("8700"))[0] == int(ber.ctx(7, False))


def test_high_tag_number_form():
    # X.690 §8.1.2.4: [APPLICATION 31] = 7F 1F; [CONTEXT 201] = BF 81 49
    assert read(bytes.fromhex("7f1f00"))[0] == int(ber.app(31))
    t, s, e, status = read(bytes.fromhex("bf814900"))
    assert (t, s, e, status) == (int(ber.ctx(201)), 4, 4, ber.OK)
    # 4 subsequent octets: the largest accepted number 2**28 - 1
    assert read(bytes.fromhex("1fffffff7f00"))[0] == (1 << 28) - 1
    assert read(bytes.fromhex("1f8180808000"))[3] == ber.BAD_TAG  # 5 octets
    assert read(bytes.fromhex("1f81"))[3] == ber.TRUNCATED  # runs out in the tag


# --- lengths ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data,content", [
    ("0400", (2, 2)),
    ("04037abcde", (2, 5)),
    ("0481037abcde", (3, 6)),  # long form, 1 octet
    ("048200037abcde", (4, 7)),  # non-minimal long form: BER allows it
    ("04840000000300aabb", (6, 9)),  # what Active Directory sends
])
def test_definite_lengths(data, content):
    t, s, e, status = read(bytes.fromhex(data))
    assert status == ber.OK and (s, e) == content


def test_length_errors():
    assert read(bytes.fromhex("3080"))[3] == ber.INDEFINITE
    assert read(bytes.fromhex("3085000000000100"))[3] == ber.BAD_LENGTH  # 5 length octets
    assert read(bytes.fromhex("30ff"))[3] == ber.BAD_LENGTH  # reserved (X.690 §8.1.3.5 c)
    assert read(bytes.fromhex("3082"))[3] == ber.TRUNCATED  # length octets cut
    assert read(bytes.fromhex("30"))[3] == ber.TRUNCATED  # no length at all
    assert read(b"")[3] == ber.TRUNCATED


def test_content_past_message_is_truncated_and_clipped():
    t, s, e, status = read(bytes.fromhex("3005020101"))
    assert status == ber.TRUNCATED and (s, e) == (2, 5)  # clipped, so a caller can decode what is there


def test_content_past_enclosing_tlv_is_bad_length():
    # SEQUENCE of 3 whose INTEGER claims 5: past its parent (3) though inside the message
    b = bytes.fromhex("3003020501020304")
    t, s, e, status = read(b)
    assert status == ber.OK
    assert read(b, s, e, len(b))[3] == ber.BAD_LENGTH


def test_huge_length_on_small_message():
    assert read(bytes.fromhex("3084ffffffff00"))[3] == ber.TRUNCATED


# --- primitive contents -------------------------------------------------------------------------------

@pytest.mark.parametrize("hex_,value", [
    ("00", 0), ("7f", 127), ("0080", 128), ("ff", -1), ("80", -128), ("ff7f", -129),
    ("00ffffffff", 0xFFFFFFFF), ("7fffffffffffffff", 2**63 - 1), ("8000000000000000", -2**63),
    ("007fffffffffffffff", 2**63 - 1),  # 9 octets with a sign octet
])
def test_read_int(hex_, value):
    b = bytes.fromhex(hex_)
    v, status = ber.read_int(_arr(b), 0, len(b))
    assert status == ber.OK and int(v) == value


@pytest.mark.parametrize("hex_", ["", "01" * 9, "008000000000000000", "01" * 10])
def test_read_int_rejects(hex_):
    b = bytes.fromhex(hex_)
    assert ber.read_int(_arr(b), 0, len(b))[1] == ber.BAD_INTEGER


def test_read_bool_and_bits():
    assert tuple(ber.read_bool(_arr(b"\xff"), 0, 1)) == (1, ber.OK)
    assert tuple(ber.read_bool(_arr(b"\x00"), 0, 1)) == (0, ber.OK)
    assert ber.read_bool(_arr(b"\x00\x00"), 0, 2)[1] == ber.BAD_INTEGER
    # KDCOptions 0x40810010 (forwardable, renewable, canonicalize, renewable-ok)
    b = bytes.fromhex("0040810010")
    assert tuple(ber.read_bits32(_arr(b), 0, 5)) == (0x40810010, ber.OK)
    assert tuple(ber.read_bits32(_arr(b"\x00\x40"), 0, 2)) == (0x40000000, ber.OK)  # short: zero padded
    assert ber.read_bits32(_arr(b"\x08\x40"), 0, 2)[1] == ber.BAD_VALUE  # unused bits > 7
    assert ber.read_bits32(_arr(b""), 0, 0)[1] == ber.BAD_VALUE


@pytest.mark.parametrize("text,ns", [
    (b"19700101000000Z", 0),
    (b"20370913024805Z", 2136422885 * 10**9),
    (b"20150119225459Z", 1421708099 * 10**9),
    (b"20000229120000.5Z", (951825600 * 10**9) + 500_000_000),
])
def test_read_time(text, ns):
    v, status = ber.read_time(_arr(text), 0, len(text))
    assert status == ber.OK and int(v) == ns


@pytest.mark.parametrize("text", [b"2015011922545Z", b"20151319225459Z", b"20150119225459", b"9999123123595 9Z",
                                  b"99991231235959Z", b"2015011922545xZ", b"20150119225459.Z"])
def test_read_time_rejects(text):
    assert ber.read_time(_arr(text), 0, len(text))[1] == ber.BAD_VALUE  # 9999 is past int64 ns


def test_put_int_and_utf8():
    a = np.zeros(64, np.uint8)
    p = ber.put_int(a, 0, -123)
    p = ber.put_int(a, p, ber.NULL)
    assert bytes(a[:p]) == b"-123-9223372036854775808"
    assert ber.put_int(np.zeros(2, np.uint8), 0, 12345) == -1
    src = "Tä(*)\\".encode() + b"\x00\xff\xc3"
    p = ber.put_utf8(a, 0, _arr(src), 0, len(src), ber.TEXT)
    assert bytes(a[:p]).decode() == "Tä(*)\\x5c\\x00\\xff\\xc3"
    p = ber.put_utf8(a, 0, _arr(src), 0, len(src), ber.FILTER_VALUE)
    assert bytes(a[:p]).decode() == "Tä\\28\\2a\\29\\5c\\00\\ff\\c3"
    # overlong / surrogate encodings are not well-formed UTF-8 (RFC 3629 §3)
    for bad in (b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"):
        p = ber.put_utf8(a, 0, _arr(bad), 0, len(bad), ber.TEXT)
        assert bytes(a[:p]).decode().count("\\x") == len(bad)
    assert ber.put_utf8(np.zeros(3, np.uint8), 0, _arr(b"\x01"), 0, 1, ber.TEXT) == -1


# --- walk: the whole tree, depth capped ---------------------------------------------------------------

def _walk(b: bytes, depth=ber.MAX_DEPTH):
    n, status = ber.walk(_arr(b), 0, len(b), depth, np.zeros(max(depth, 1), np.int64))
    return int(n), int(status)


def test_walk_counts_and_caps_depth():
    assert _walk(seq(integer(5), seq(octets("ab"), tlv(0x05)))) == (5, ber.OK)
    nested = b"\x05\x00"
    for _ in range(70):
        nested = seq(nested)
    assert _walk(nested, 64)[1] == ber.TOO_DEEP
    assert _walk(nested, 80) == (71, ber.OK)
    assert _walk(bytes.fromhex("3006a0040202ffff")) == (3, ber.OK)
    assert _walk(bytes.fromhex("3006a0030202ffff"))[1] == ber.BAD_LENGTH  # INTEGER past its [0]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_walk_never_fails_on_random_bytes(data):
    n, status = _walk(data, 16)
    assert n >= 0 and status in ber.STATUS_NAMES or status == ber.OK


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 70))
def test_read_tlv_stays_inside(data, cut):
    end = min(cut, len(data))
    t, s, e, status = read(data, 0, end, end)
    assert 0 <= s <= e <= max(end, s)
    if status == ber.OK:
        assert e <= end
