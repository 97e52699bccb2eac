"""Token sets of kerberos_ap's carriers (:mod:`.kerberos_ap`), found where the carrier's messages are.

A carrier's token source needs the carrier's message bytes, which its decoder holds only while it
builds its messages frame. Framing the carrier's connections again for kerberos_ap costs as much as
the first framing (on the 1M-packet synthetic capture every SMB2 connection has a SESSION_SETUP: all
of SMB2 again, 0.11 s), so a decoder that builds its messages frame from a protocol's whole message
sets hands them to :func:`remember`: the tokens the carrier's kernel finds in them are kept (their
bytes only, copied out of the message buffer) until kerberos_ap reads them (:func:`remembered`).
A capture whose decoder did not (its frame set from outside, or a decoder that does not call it)
has its connections framed again, as before.

The carrier's kernel is the one :func:`register_kernel` names for the carrier's messages frame
(``kerberos_ap.carrier_source`` registers it), so a decoder only says which frame it built.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl

from ..message_set import MessageSet
from .kerberos_ap_carriers import copy_tokens

# messages frame -> (the kerberos_ap_carriers kernel of its carrier, its rows that can carry a token)
_KERNELS: dict[str, tuple[Callable, pl.Expr]] = {}


def register_kernel(messages_frame: str, kernel: Callable, wanted: pl.Expr) -> None:
    """The kernel (one of :mod:`.kerberos_ap_carriers`') that finds the tokens in the message sets
    ``messages_frame`` is built from; ``wanted``: the frame's rows that can carry one."""
    _KERNELS[messages_frame] = (kernel, wanted)


def carrier_columns(messages_frame: str) -> frozenset[str]:
    """What a carrier's token source reads of ``messages_frame`` (``kerberos_ap.carrier_source``: the
    rows that can carry a token, their transport and flow); none when it is no carrier's. A scan keeps
    them when it narrows the frame before kerberos_ap is built (``analyzer.narrowing``)."""
    registered = _KERNELS.get(messages_frame)
    if registered is None:
        return frozenset()
    return frozenset(("transport", "flow", *registered[1].meta.root_names()))


def _memo_key(messages_frame: str) -> str:
    return f"kerberos_ap_tokens:{messages_frame}"


def token_sets(sets: list[MessageSet], kernel, compact: bool = False) -> list[MessageSet]:
    """Carrier message sets → token sets through one of :mod:`.kerberos_ap_carriers`' kernels: per
    token, the carrier message's row with ``offset`` / ``length`` the token's bytes and
    ``carrier_status``. ``compact``: each set's buffer holds the tokens' bytes only (what is kept
    beyond the message buffer's life); the tokens' decoders read nothing outside a token."""
    out = []
    for ms in sets:
        if not ms.height:
            continue
        fr = ms.frame
        args = (ms.buf, fr["offset"].to_numpy().astype(np.int64), fr["length"].to_numpy().astype(np.int64),
                fr["wire_length"].to_numpy().astype(np.int64))
        n = kernel(*args, np.empty((4, 0), np.int64), False)
        if n == 0:
            continue
        found = np.empty((4, n), np.int64)
        kernel(*args, found, True)
        start, length, buf = found[1], found[2], ms.buf
        if compact:
            if start.min() < 0 or (start + length).max() > ms.buf.shape[0]:
                raise ValueError("carrier tokens outside their message buffer")
            at = np.zeros(n + 1, np.int64)
            np.cumsum(length, out=at[1:])
            buf = np.empty(int(at[-1]), np.uint8)
            copy_tokens(ms.buf, start, length, at, buf)
            start = at[:-1]
        tokens = fr[found[0]].with_columns(pl.Series("offset", start), pl.Series("length", length).cast(pl.UInt32),
                                           pl.Series("carrier_status", found[3]))
        out.append(MessageSet(tokens, buf))
    return out


def remember(cap, messages_frame: str, sets: list[MessageSet], frame: pl.DataFrame) -> None:
    """Keep the tokens of ``sets`` (all of a protocol's message sets, ``frame`` the messages frame
    built from them) for kerberos_ap, when a carrier's kernel is registered for that frame; none
    (and the kernel not even loaded) when no row of ``frame`` can carry a token."""
    keep(cap, messages_frame, carried(messages_frame, sets, frame))


def carried(messages_frame: str, sets: list[MessageSet], frame: pl.DataFrame) -> list[MessageSet] | None:
    """The token sets of ``sets`` (``frame`` the messages decoded from them; all of a protocol's sets,
    or one batch of its connections), compacted: what :func:`keep` keeps. None when no carrier's
    kernel is registered for ``messages_frame``; empty (the kernel not even loaded) when no row of
    ``frame`` can carry a token."""
    registered = _KERNELS.get(messages_frame)
    if registered is None:
        return None
    kernel, wanted = registered
    return token_sets(sets, kernel, compact=True) if frame.filter(wanted).height else []


def keep(cap, messages_frame: str, tokens: list[MessageSet] | None) -> None:
    """Keep these token sets (:func:`carried`, of every set of the protocol, in the order of its sets)
    for kerberos_ap; nothing when there is no carrier (None) or ``cap`` keeps no memos."""
    memo = getattr(cap, "memo", None)
    if tokens is not None and memo is not None:
        memo(_memo_key(messages_frame), lambda: tokens)


def remembered(cap, messages_frame: str) -> list[MessageSet] | None:
    """The token sets :func:`remember` kept for ``messages_frame``, or None when it kept none."""
    memo = getattr(cap, "memo", None)
    return memo(_memo_key(messages_frame), lambda: None) if memo is not None else None
