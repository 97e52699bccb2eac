"""What a decoder reads: the :class:`MessageSet` (a frame of application messages and the bytes its
``offset`` column indexes) and its columns.

Its own module so that the two producers of message sets, :mod:`analyzer.messages` (UDP datagrams,
and a protocol's message sets from its declaration) and :mod:`analyzer.tcp.framing` (messages framed
out of reassembled TCP streams), both import it and neither imports the other's caller.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .schema import Column, column

TRANSPORTS = pl.Enum(["udp", "tcp"])

MESSAGE_COLUMNS: tuple[Column, ...] = (
    column("transport", object, "udp or tcp", polars=TRANSPORTS),
    column("flow", np.uint32, "UDP: dense id of the (client, client port, server, server port) flow; "
         "TCP: the connection id of the connections frame"),
    column("from_client", np.bool_, "sent by the client, as the protocol's client_side rule decides "
         "(analyzer/decoders/protocol.py; for DNS, Kerberos, LDAP and SMB2: towards the service port). "
         "For TCP it follows that rule too (service_port: the side sending to the service port), which "
         "can differ from connections.client (the SYN sender) when the SYN sender is on the service port"),
    column("src", object, "source address"),
    column("dst", object, "destination address"),
    column("sport", np.uint16, "source port"),
    column("dport", np.uint16, "destination port"),
    column("frame_first", np.uint32, "frame number of the first packet carrying the message"),
    column("frame_last", np.uint32, "frame number of the last packet carrying the message (where Wireshark "
         "shows the reassembled message)"),
    column("ts_first_ns", np.int64, "time of the first packet of the message"),
    column("ts_last_ns", np.int64, "time of the last packet of the message"),
    column("offset", np.int64, "offset of the message's first byte in the message set's buffer"),
    column("length", np.uint32, "bytes of the message available in the buffer"),
    column("wire_length", np.uint32, "bytes the message has on the wire (more than length when the "
         "snapshot length or a missing fragment/segment cut it)"),
    column("complete", np.bool_, "every byte of the message was captured (length may still be shorter when a "
         "framing copies only a message's first bytes, e.g. the header of a 1 MiB SMB2 WRITE)"),
)


# The message-set columns every decoder's message frame keeps (offset and length only locate bytes).
KEPT_COLUMNS: tuple[Column, ...] = tuple(c for c in MESSAGE_COLUMNS if c.name not in ("offset", "length"))


@dataclass
class MessageSet:
    """Messages (``frame``, columns as MESSAGE_COLUMNS) and the bytes their offsets index.

    ``stats`` (TCP only, else None): per-direction reassembly and framing figures, one row per
    (``conn``, ``from_client``) direction, oriented as :func:`analyzer.tcp.tcp_messages` orients it
    (its ``client_side``: "service_port" or "connection_initiator"). Under a protocol's "message"
    rule the frame's ``from_client`` is decided per message from its bytes afterwards while ``stats``
    keeps that TCP orientation ("connection_initiator"): a direction's messages need not all agree,
    so there is no one per-direction flip to apply."""

    frame: pl.DataFrame
    buf: np.ndarray
    stats: pl.DataFrame | None = None  # TCP: per-direction reassembly and framing figures (see above)

    @property
    def height(self) -> int:
        return self.frame.height

    def message_bytes(self, row: int) -> bytes:
        """One message's available bytes (for tests and drill-down, not for hot paths)."""
        off = int(self.frame["offset"][row])
        return bytes(self.buf[off:off + int(self.frame["length"][row])])
