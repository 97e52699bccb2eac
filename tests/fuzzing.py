"""Hostile-input helpers for the decoder tests: mutations of well-formed messages.

A random mutation of a valid message reaches deeper into a decoder than random bytes do (the outer
framing still parses, the damage is inside), so the "never raises" tests of the BER decoders mutate
samples with :func:`mutate`, each with the bytes that matter to its own encoding.
"""
from __future__ import annotations

import random

# Bytes that stress any BER decoder: long-form lengths (0x80 indefinite, 0x84 four octets, 0x81 one),
# the largest/zero octet and a length that is just short of the long form.
BER_SPECIAL = (0x80, 0x84, 0xFF, 0x00, 0x7F, 0x81)
# ... and the tags of GSS-API carriers: InitialContextToken [APPLICATION 0], SPNEGO negTokenResp [1],
# Kerberos AP-REQ [APPLICATION 14].
GSSAPI_SPECIAL = BER_SPECIAL + (0x60, 0xA1, 0x6E)


def mutate(data: bytes, rnd: random.Random, special, max_edits: int = 6, max_insert: int = 4) -> bytes:
    """``data`` after 1 to ``max_edits`` random edits drawn from ``rnd``: overwrite a byte with a random
    one, truncate at a random offset, insert 1 to ``max_insert`` random bytes, or overwrite a byte with
    one of ``special`` (tags and length octets that the decoder under test must treat with care).
    Deterministic for a given state of ``rnd``."""
    b = bytearray(data)
    for _ in range(rnd.randint(1, max_edits)):
        op = rnd.randint(0, 3)
        if op == 0 and b:
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif op == 1 and b:
            del b[rnd.randrange(len(b)):]
        elif op == 2:
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, max_insert)))
        elif b:
            b[rnd.randrange(len(b))] = rnd.choice(special)
    return bytes(b)
