"""Which addresses run several request streams at once: the test behind the one client-identity rule
(``base.client_identity_by``).

An address whose requests are outstanding at the same time from different ports runs independent
request streams (processes on one node, NAT, containers) and its clients are address:port; one whose
requests are sequential is one client however many ports it uses. Per address (within a group such
as a server), in the requests' order of sending: a request splits its address when it is sent before
the latest end of the address's earlier requests and from another port than the request just before
it. The walk is a Numba kernel over integer columns: the same test as Polars expressions (a sort of
the requests by group and time, a cumulative maximum over each group) held ~180 bytes a request at
its peak (toctou's 2.2M LDAP requests at 10x the 10M synth capture: ~400 MB); this holds ~36 and
the sort's index.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.jit import njit
from analyzer.wide_frames import row_wise

_NULL = np.iinfo(np.int64).min  # a missing time: sorts first, as Polars sorts nulls, and is never compared


def split_rows(requests: pl.DataFrame, by: list[str], addr: str, port: str, start: str, end: str,
               timeout_ns: int) -> pl.Series | None:
    """The rows of ``requests`` whose address (within ``by``) runs concurrent request streams from
    different ports (module doc): an end that is null means outstanding for ``timeout_ns``. None when
    no address does."""
    group = row_wise(requests, pl.struct([pl.col(c) for c in by] + [pl.col(addr).cast(pl.String)]).hash()).to_numpy()
    begun = pl.col(start).cast(pl.Int64)
    sent, ended, ports = (requests.select(expr)[:, 0].to_numpy() for expr in (
        begun.fill_null(_NULL), pl.coalesce(pl.col(end).cast(pl.Int64), begun + timeout_ns).fill_null(_NULL),
        pl.col(port).cast(pl.Int32).fill_null(-1)))
    order = np.lexsort((sent, group))  # stable: by group, then time (missing first), then row
    split = _split_groups(group, order, sent, ended, ports)
    return pl.Series(split) if split.any() else None


@njit(cache=True)
def _split_groups(group, order, sent, ended, port):  # pragma: no cover - compiled
    """Per row, whether its group is split: walking each group's rows in ``order``, a row sent before
    the latest end of the rows before it (the end of a row with none unknown: no test) from another
    port than the row before it (ports -1: none)."""
    n = order.shape[0]
    out = np.zeros(n, np.bool_)
    i = 0
    while i < n:
        j = i + 1
        while j < n and group[order[j]] == group[order[i]]:
            j += 1
        latest = _NULL  # the greatest end so far (unknown when the row before had none)
        known = False
        split = False
        for k in range(i, j):
            row = order[k]
            if k > i and known and sent[row] != _NULL and sent[row] < latest:
                before = order[k - 1]
                if port[row] >= 0 and port[before] >= 0 and port[row] != port[before]:
                    split = True
                    break
            if ended[row] != _NULL:
                latest = ended[row] if latest == _NULL or ended[row] > latest else latest
                known = True
            else:
                known = False
        if split:
            for k in range(i, j):
                out[order[k]] = True
        i = j
    return out
