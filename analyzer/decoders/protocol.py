"""One declaration per protocol: what every other layer needs to know about a decoder.

A decoder module declares ``PROTOCOL = Protocol(...)`` beside its frame builders, and
``analyzer/decoders/registry.py`` lists the module once. Every list that names protocols — the
transaction frames the detectors read, ``stats``' protocol order and names, the service names of
``info``'s port table, which ports are framed with which TCP framing, the nouns detectors put in
their sentences — is derived from these declarations (:mod:`analyzer.decoders.registry`), so adding
a protocol touches its own module(s) and that one line. The TCP framings themselves are not: a
declaration names one of the framing kernels of ``analyzer.tcp.framing.FRAMINGS`` (a new wire
framing is a kernel there).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# How to tell the client side of a flow (``from_client`` of the message sets):
# - "service_port": the side sending *to* one of the protocol's ports (the lower one when both ends
#   use a service port). Right for DNS, Kerberos, LDAP, SMB2: their clients use ephemeral ports.
# - "connection_initiator": TCP: the side that sent the SYN (analyzer.tcp's client_side), whatever
#   the ports; UDP falls back to "service_port". For protocols that use one port at both ends or call
#   back (NFSv4 callbacks, RFC 8881 §2.10.3.1 on the fore channel's connection).
# - "message": the decoder decides per message from its bytes (ONC-RPC's msg_type CALL/REPLY,
#   RFC 5531 §9; RoCEv2 opcodes on UDP 4791 at both ends): ``Protocol.message_direction`` names a
#   function(MessageSet) -> bool array (True: sent by the client).
CLIENT_SIDE_RULES = ("service_port", "connection_initiator", "message")


@dataclass(frozen=True, eq=False)  # identity equality and hash: its dict fields are not hashable
class Protocol:
    """What a decoder is: its name, where it listens, how its TCP stream is framed, which side is the
    client, the frames it builds and the words a sentence about it uses. Frozen; compared and hashed
    by identity (one declaration per protocol), so it can key a dict or sit in a set."""

    name: str  # lower-case key: frame prefix ("dns" -> dns_messages), the ``protocol`` value of stats
    title: str  # how a person writes it: "DNS", "Kerberos", "SMB2"
    spec: str  # the reference its decoder follows ("RFC 1035", "MS-SMB2")
    udp_ports: tuple[int, ...] = ()
    tcp_ports: tuple[int, ...] = ()
    tcp_framing: str | None = None  # a name of analyzer.tcp.framing.FRAMINGS
    client_side: str = "service_port"  # one of CLIENT_SIDE_RULES
    message_direction: str | None = None  # "module:function" for client_side == "message"
    frames: tuple[str, ...] = ()  # every frame the decoder's builders register
    # of those, the frames built from its other frames alone (no bytes, packets or memos): a scan builds
    # them after the builders' memos are let go of (analyzer.narrowing.build_frames; SMB2's breaks)
    from_frames: tuple[str, ...] = ()
    # of those, the frames whose rows a server's state across its clients decides (an SMB2 break's
    # trigger is another client's CREATE; an NFS file handle's path, another client's LOOKUP) -> the
    # frames of the protocol they are built of alone: a server cut into shards of its clients builds
    # them anew on its shards' merged frames (analyzer.shards)
    server_frames: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # of those frames' sources, the columns their builders read (a source not named: read whole): a shard
    # hands over no more of them than these and what the detectors read
    server_frame_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    transactions: str | None = None  # the frame that starts with common.TRANSACTION_COMMON, if any
    # operations that set a session up or tear it down rather than do work (conn_churn's "setup")
    setup_operations: tuple[str, ...] = ()
    setup_words: str = ""  # the set-up in a sentence: "bind", "negotiate/session setup"
    # operations that count as the unit of useful work when present (SMB2: CREATE, an open per file)
    work_operations: tuple[str, ...] = ()
    requests_noun: str = ""  # plural, in a sentence: "DNS queries", "Kerberos requests"
    work_noun: str = ""  # what conn_churn counts per connection: "LDAP operations", "SMB2 opens"
    # -- how the detectors' sentences word its requests (empty / () : the generic wording) --
    # herd: "N clients <request_verb> <resource>" ("queried"); empty: "sent <operation> for"
    request_verb: str = ""
    # herd: ... when the clients asked again right as their cached answer expired ("re-queried")
    repeat_verb: str = ""
    # retry_storm: "resent <request_word> for <resource>" whatever the operation ("queries");
    # empty: the operation's name ("AS-REQs", "search requests")
    request_word: str = ""
    # operation names a sentence puts in the plural as they are: "sent AS-REQs for"
    plural_operations: tuple[str, ...] = ()
    # operation -> the word for one in a sentence where the wire name does not read as one
    # ("searchRequest" -> "search", "CREATE" -> "open"); others: the name without "Request"
    operation_words: dict[str, str] = field(default_factory=dict)
    # the operation qualifies the resource and is written after it: DNS "example.com A" (the QTYPE)
    operation_after_resource: bool = False
    # port -> service name for info's port table (as tshark's port tables name it)
    services: dict[int, str] = field(default_factory=dict)
    # -- retries the protocol itself recognises (retry_storm) --
    # "module:function"(messages, transactions) -> one row per *retransmitted* send of a request that the
    # transactions frame folds into its first send's row (a DNS query re-sent with its id, an RPC call
    # with its xid): client, client_port, server, server_port, ts (ns), frame, and ``txn``, the row number
    # in ``transactions`` of the transaction it re-sends. Messages come from ``resends_frame``. Such a
    # resend is the application retrying (TCP's own retransmissions never reach the message layer), so
    # it counts on any connection. None: the protocol folds no resends.
    resends: str | None = None
    resends_frame: str | None = None  # the message frame ``resends`` reads (one of ``frames``)
    # the columns of it ``resends`` reads (a scan keeps of the frame no more for it: retry_storm's COLUMNS)
    resends_columns: tuple[str, ...] = ()
    # the rows of it ``resends`` reads, a Polars expression over those columns (None: every row): what a
    # shard of a cut server hands over of the frame for it (retry_storm's ROWS)
    resends_rows: object = None
    # the transactions column counting those resends: what is known of them without the message frame
    resends_count: str | None = None
    # (operation, status) answers that say "held by someone else, ask again" — a poll of a contended
    # resource, not a failure (NFSv4 LOCK -> NFS4ERR_DENIED): asks so answered are lock_polling's, and
    # retry_storm leaves them out
    poll_answers: tuple[tuple[str, str], ...] = ()
    # transport -> (the client's usual retry timer, ns; where that default is written): named by
    # retry_storm when the measured timer is that default
    retry_timers: dict[str, tuple[int, str]] = field(default_factory=dict)

    def __post_init__(self):
        if self.client_side not in CLIENT_SIDE_RULES:
            raise ValueError(f"{self.name}: client_side {self.client_side!r} is not one of {CLIENT_SIDE_RULES}")
        if self.client_side == "message" and not self.message_direction:
            raise ValueError(f"{self.name}: client_side 'message' needs message_direction")
        if self.transactions is not None and self.transactions not in self.frames:
            raise ValueError(f"{self.name}: transactions frame {self.transactions!r} is not among its frames")
        if bool(self.resends) != bool(self.resends_frame):
            raise ValueError(f"{self.name}: resends and resends_frame go together")
        if self.resends_frame is not None and self.resends_frame not in self.frames:
            raise ValueError(f"{self.name}: resends frame {self.resends_frame!r} is not among its frames")
        if bool(self.resends) != bool(self.resends_columns):
            raise ValueError(f"{self.name}: resends and resends_columns go together")
        if self.resends_rows is not None and not self.resends:
            raise ValueError(f"{self.name}: resends_rows without resends")
        if not set(self.from_frames) <= set(self.frames):
            raise ValueError(f"{self.name}: from_frames {self.from_frames!r} are not all among its frames")
        if not {f for k, v in self.server_frames.items() for f in (k, *v)} <= set(self.frames):
            raise ValueError(f"{self.name}: server_frames {self.server_frames!r} are not all among its frames")
        if not set(self.server_frame_columns) <= {f for v in self.server_frames.values() for f in v}:
            raise ValueError(f"{self.name}: server_frame_columns {sorted(self.server_frame_columns)!r} are not all "
                             f"sources of its server_frames")
        if self.tcp_ports and not self.tcp_framing:
            raise ValueError(f"{self.name}: TCP ports without a framing")

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.udp_ports) | set(self.tcp_ports)))
