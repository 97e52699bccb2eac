"""Who took part in each finding (its clients and servers), for the incident linker.

A finding names its participants three ways, all used:

- its ``client`` and ``server`` columns (an address, ``address:port``, ``[v6]:port`` or a comma list);
- a population's members (rows with ``member_of`` = its id in :func:`detectors.run`'s output): their
  clients and servers are the population's;
- the addresses of its evidence frames: where the finding names its server(s), the other addresses of
  its evidence are its clients (a herd names only the resolver: the askers are in its query frames);
  where it names only its client(s), the others are its servers (incast's fan-out); where it names
  neither, every evidence address counts as a client.

A scan frees the packets' addresses before its detectors run (issue 13, ``Capture.release``), so
:func:`retain` takes what the linker needs first: the ``frame``, ``src`` and ``dst`` columns of
``packets`` (a zero-copy selection that keeps those two Enum columns alive: a few bytes per packet,
4 measured on a 1-million-packet synthetic capture, the only per-packet cost of incidents; a scan in
partitions, whose caller keeps no column of every packet, reads the evidence frames' addresses again
from the files instead, ``analyzer.partitions.packets_reader``) and, when the DNS transactions are
among the frames built anyway, the offsets of one early and one late answered UDP A/AAAA response
per name (one small row per DNS name), whose answers :mod:`detectors.incidents_dns` reads on demand.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import numpy as np
import polars as pl

from analyzer.decoders import registry

from .base import EVIDENCE_CAP
from .incidents_dns import TYPE_A, TYPE_AAAA, answer_addresses

DNS_FRAME = "dns_transactions"
# what the linker reads of them (_dns_responses), declared as a detector declares what it reads (base.py:
# REQUIRES, COLUMNS): a scan in partitions sends its caller no more of them (scan_command.caller_columns)
DNS_COLUMNS = ("answered", "transport", "qtype", "ancount", "response_frame", "resource")
READS = SimpleNamespace(REQUIRES=(DNS_FRAME,), COLUMNS={DNS_FRAME: DNS_COLUMNS})
# what retain() reads of the packets frame: each frame's addresses, and where the DNS responses are
PAYLOAD_COLUMNS = ("payload_offset", "payload_caplen")  # where a packet's payload is in the capture
RETAINED_PACKET_COLUMNS = ("frame", "src", "dst", *PAYLOAD_COLUMNS)


@dataclass
class Retained:
    """What :func:`retain` kept of a capture for :func:`detectors.incidents.link`."""

    addresses: pl.DataFrame | None = None  # frame (ascending), src, dst: one row per packet
    # or, where the capture kept no addresses (a scan in partitions): frames -> those rows, read again
    read_addresses: Callable[[np.ndarray], pl.DataFrame] | None = None
    dns_responses: pl.DataFrame | None = None  # name (lower case), payload_offset, payload_caplen
    read_bytes: Callable[[int, int], bytes] | None = None  # the capture's bytes_at
    _resolved: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def evidence_addresses(self, findings: pl.DataFrame) -> dict[str, set[str]]:
        """finding_id -> the source and destination addresses of its evidence frames."""
        if (self.addresses is None and self.read_addresses is None) or findings.height == 0:
            return {}
        # the first EVIDENCE_CAP frames (as scan keeps them): `show`, which lifts the cap, links the same
        ev = (findings.select("finding_id", pl.col("evidence_frames").list.head(EVIDENCE_CAP))
              .explode("evidence_frames").drop_nulls())
        if ev.height == 0:
            return {}
        addresses = (self.addresses if self.addresses is not None
                     else self.read_addresses(ev["evidence_frames"].unique().to_numpy()))
        frames = addresses["frame"]
        wanted = ev["evidence_frames"].cast(frames.dtype)
        pos = frames.search_sorted(wanted).to_numpy().clip(0, max(frames.len() - 1, 0))
        hit = frames.to_numpy()[pos] == wanted.to_numpy() if frames.len() else np.zeros(wanted.len(), np.bool_)
        rows = addresses[pl.Series(pos[hit])]
        ids = ev["finding_id"].filter(pl.Series(hit))
        pairs = pl.concat([pl.DataFrame({"finding_id": ids, "addr": rows[c].cast(pl.String)})
                           for c in ("src", "dst")]).drop_nulls().unique()
        out: dict[str, set[str]] = {}
        for fid, addr in pairs.iter_rows():
            out.setdefault(fid, set()).add(addr)
        return out

    def resolves_to(self, name: str | None) -> tuple[str, ...]:
        """The addresses the capture's DNS answers give for ``name`` (empty when none was seen)."""
        if not name or self.dns_responses is None or self.read_bytes is None:
            return ()
        key = name.rstrip(".").lower()
        if key not in self._resolved:
            rows = self.dns_responses.filter(pl.col("name") == key)
            found: dict[str, None] = {}
            for offset, caplen in rows.select("payload_offset", "payload_caplen").iter_rows():
                found.update(dict.fromkeys(answer_addresses(self.read_bytes(int(offset), int(caplen)))))
            self._resolved[key] = tuple(found)
        return self._resolved[key]


def dns_payloads(packets: pl.DataFrame) -> pl.DataFrame:
    """Where the packets to or from a DNS port (the DNS decoder's UDP ports: every datagram it decodes,
    so every UDP response :func:`retain` reads) are in the capture: frame and :data:`PAYLOAD_COLUMNS`
    of those rows, in frame order. What a scan in partitions keeps of the payload columns while its partitions
    decode, instead of 12 bytes of every packet (120 MB of the calling process at 10M packets)."""
    ports = sorted(registry.protocol("dns").udp_ports)
    return packets.filter(pl.col("sport").is_in(ports) | pl.col("dport").is_in(ports)).select("frame", *PAYLOAD_COLUMNS)


def retain(capture, frames=None, payloads: pl.DataFrame | None = None,
           read_addresses: Callable[[np.ndarray], pl.DataFrame] | None = None) -> Retained:
    """What the linker reads, taken from ``capture`` while it still has it: call it before
    ``detectors.run(..., release=True)`` with the frames the run builds (``required_frames``), or
    after a plain run with ``frames`` None (then only the DNS transactions already built are read).
    The DNS responses are taken from the DNS transactions as the run builds them, whole, among its other
    frames (``Capture.when_built``), and their places from :func:`dns_payloads` taken now: the linker
    used to build them first, alone, before the run (on the 1M synth capture ~0.4 s of decoding on one
    thread, with every column of the packets still held).
    ``payloads``: :func:`dns_payloads`, taken before the packets frame lost its payload columns.
    ``read_addresses``: where the packets frame has no addresses (a scan in partitions), what reads
    (frame, src, dst) of the evidence frames from the files (``analyzer.partitions.packets_reader``)."""
    packets = capture.packets
    out = Retained(read_bytes=getattr(capture, "bytes_at", None))
    if {"src", "dst"} <= set(packets.columns):  # RETAINED_PACKET_COLUMNS
        out.addresses = packets.select("frame", "src", "dst")
    else:
        out.read_addresses = read_addresses
    dns = capture.built_frames().get(DNS_FRAME) if hasattr(capture, "built_frames") else None
    later = dns is None and frames is not None and DNS_FRAME in frames  # built by the run, with the others
    located = packets if payloads is None else payloads
    if not set(PAYLOAD_COLUMNS) <= set(located.columns):
        return out
    if later and payloads is None:  # what the run's narrowing of the packets will free
        located = dns_payloads(packets)

    def take(built: pl.DataFrame) -> None:
        if built.height:
            out.dns_responses = _dns_responses(built, located)
    if later:
        capture.when_built(DNS_FRAME, take)
    elif dns is not None:
        take(dns)
    return out


def _dns_responses(dns: pl.DataFrame, packets: pl.DataFrame) -> pl.DataFrame:
    """Per DNS name: the first and the last answered UDP A/AAAA response with answers, located."""
    answered = (dns.select(DNS_COLUMNS).filter(pl.col("answered") & (pl.col("transport").cast(pl.String) == "udp")
                           & pl.col("qtype").is_in([TYPE_A, TYPE_AAAA]) & (pl.col("ancount") > 0)
                           & pl.col("response_frame").is_not_null() & pl.col("resource").is_not_null())
                .select(pl.col("resource").str.strip_chars_end(".").str.to_lowercase().alias("name"),
                        "response_frame"))
    if answered.height == 0:
        return pl.DataFrame(schema={"name": pl.String, "payload_offset": pl.Int64, "payload_caplen": pl.UInt32})
    picks = (answered.group_by("name").agg(pl.col("response_frame").min().alias("a"),
                                           pl.col("response_frame").max().alias("b"))
             .unpivot(index="name", value_name="response_frame").select("name", "response_frame").unique())
    frames = packets["frame"]
    wanted = picks["response_frame"].cast(frames.dtype)
    pos = frames.search_sorted(wanted).to_numpy().clip(0, max(frames.len() - 1, 0))
    hit = frames.to_numpy()[pos] == wanted.to_numpy()
    located = packets.select("payload_offset", "payload_caplen")[pl.Series(pos[hit])]
    return pl.concat([picks.filter(pl.Series(hit)).select("name"), located], how="horizontal") \
        .drop_nulls().sort("name", "payload_offset")


def addresses_of(text: str | None) -> set[str]:
    """The addresses a ``client`` / ``server`` value names (ports dropped; anything that is not an
    address, such as "+3 more", ignored)."""
    out = set()
    for token in (text or "").replace(";", ",").split(","):
        token = token.strip()
        if token.startswith("[") and "]" in token:
            token = token[1:token.index("]")]
        elif token.count(":") == 1:
            token = token.partition(":")[0]
        try:
            out.add(str(ipaddress.ip_address(token)))
        except ValueError:
            continue
    return out


@dataclass
class Participants:
    clients: set[str] = field(default_factory=set)
    servers: set[str] = field(default_factory=set)


def participants(findings: pl.DataFrame, retained: Retained) -> dict[str, Participants]:
    """finding_id -> its :class:`Participants` (a population's include its members')."""
    evidence = retained.evidence_addresses(findings)
    out: dict[str, Participants] = {}
    for fid, client, server in findings.select("finding_id", "client", "server").iter_rows():
        p = Participants(addresses_of(client), addresses_of(server))
        seen = evidence.get(fid, set())
        if p.servers:
            p.clients |= seen - p.servers
        elif p.clients:
            p.servers |= seen - p.clients
        else:
            p.clients |= seen
        out[fid] = p
    for fid, of in findings.filter(pl.col("member_of").is_not_null()).select("finding_id", "member_of").iter_rows():
        if of in out:
            out[of].clients |= out[fid].clients
            out[of].servers |= out[fid].servers
    return out
