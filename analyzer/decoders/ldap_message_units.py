"""Pass 1 over an LDAP message set: where its LDAPMessages are, shared by ``ldap_messages``
(:mod:`.ldap`) and ``ldap_sync`` (:mod:`.ldap_sync`), so both frames see the same units without
either decoder importing the other. The kernels are :mod:`.ldap_units`'."""
from __future__ import annotations

import numpy as np

from ..message_set import MessageSet


def units(ms: MessageSet):
    """Pass 1 over a message set: where its LDAPMessages are (plain, several in a CLDAP datagram, inside
    an integrity-only SASL buffer). Returns (u_start, u_end, u_kind, u_msg, u_index): per unit its byte
    range in ``ms.buf``, its kind (``ldap_layout.K_*``), the framed message it came from and its index
    among that message's units. Shared by ``ldap_messages`` and ``ldap_sync``."""
    from .ldap_units import count_units, fill_units  # lazy: Numba kernels, only with LDAP messages

    offsets = ms.frame["offset"].to_numpy().astype(np.int64)
    lengths = ms.frame["length"].to_numpy().astype(np.int64)
    n = offsets.shape[0]
    if n and (offsets.min() < 0 or (offsets + lengths).max() > ms.buf.shape[0]):
        raise ValueError("message set offsets/lengths outside its buffer")
    counts = np.zeros(n, np.int64)
    count_units(ms.buf, offsets, lengths, counts)
    first = np.zeros(n, np.int64)
    if n:
        np.cumsum(counts[:-1], out=first[1:])
    total = int(counts.sum())
    u_start = np.empty(total, np.int64)
    u_end = np.empty(total, np.int64)
    u_kind = np.empty(total, np.int64)
    u_msg = np.empty(total, np.int64)
    fill_units(ms.buf, offsets, lengths, first, u_start, u_end, u_kind, u_msg)
    u_index = np.arange(total, dtype=np.int64) - first[u_msg] if total else np.zeros(0, np.int64)
    return u_start, u_end, u_kind, u_msg, u_index
