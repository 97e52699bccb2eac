"""LDAP multi-provider replication conflicts (``replication_conflict``): one entry changed on two
providers before either change reached the other, the later CSN wins everywhere, the other write is lost.

The pathology
    In multi-provider (multi-master) LDAP replication every provider accepts writes and replicates
    them to the others (OpenLDAP syncrepl with ``multiprovider on``; Active Directory's multi-master
    replication). Two clients that change the same attribute of the same entry on two providers
    within the replication delay both get success; each provider stamps its change with its own
    change sequence number (CSN: time, change count, serverID, modification count) and pushes the
    entry to the other; each keeps the version with the later CSN. Both servers converge, on one of
    the two values: the other write is silently lost (a lost update across servers, no error to any
    client). At µs network RTTs the window is the replication delay itself (a few ms), and writers
    that fan out to "the nearest DC" hit it. Active Directory resolves the same collision on object
    *names* by renaming the loser to ``<RDN>\\0ACNF:<objectGUID>`` (MS-ADTS 3.1.1.5.5.6.2): such
    conflict objects visible in search results are the residue of one.

The signal (``ldap_sync``: analyzer/decoders/ldap_sync.py; ``ldap_transactions``)
    * Versions: every (entry, entryCSN) seen on the wire, from Sync State entries (RFC 4533 §2.3) a
      provider pushes to a consumer and from ordinary search results that show entryCSN. An entry is
      its entryUUID (RFC 4530; the Sync State syncUUID), or its DN where no UUID is seen. The CSN's
      serverID (OpenLDAP's ``YYYYmmddHHMMSS.uuuuuuZ#count#sid#mod``) names the provider that made the
      change; a provider's address gets its serverID from the ``sid=`` of the syncCookies it sends.
      A version seen twice (pushed to two consumers, re-sent in a refresh) is one version.
    * Writes: client modify / add requests that succeeded, matched to the version they made (same
      entry, the server with the version's serverID, the latest write before the version was seen).
    * Pairs: consecutive versions of one entry in CSN order made by two different serverIDs (prev,
      next). They are *concurrent* when next was set going before prev reached next's provider: prev's
      Sync State push to that provider arrives (capture time) after next's client sent its write (or,
      with no matched write, after next itself was first seen on the wire): next's writer could not
      have seen prev there. When prev arrived while next's write was in flight (after the request,
      before the response) the server's own stamp decides: concurrent when next's CSN time is before
      the arrival (this compares the provider's clock with the capture's: NTP-synchronised clocks are
      good to about a millisecond, so a write in flight for less than that can be misjudged). When that push is not in the capture, the CSN times stand in:
      concurrent when next's CSN is less than ``fallback_delay_ns`` after prev's (kind
      ``probable_lost_update``, at most ``unverified_severity``).
    * Lost: the attributes prev changed (its write's attributes; without a matched write, every
      non-operational attribute whose value differs) whose value in next differs (digest of the
      values, ``ldap_sync.value_digests``) or is gone: prev's value was overwritten by a change made
      without knowledge of it. The finding names both writes (clients, providers, CSNs, frames), the
      attribute, the value lost and the value kept, and the gap between the two CSNs against the
      replication delay seen on the wire (prev's CSN time to its arrival at next's provider).
    * ``divergence``: a pair after which a provider serves prev (a search result or a push carrying
      prev's CSN) after it had next (next's own provider: after next was first seen; another: after
      next's push reached it), or two providers serve next's CSN with different values (a merge
      that went differently on each): it holds the older version while another holds the newer one (seen with OpenLDAP 2.5 when the other provider's push
      lands while the local write is in flight, or is applied late by a busy consumer thread: then
      even a pair that looks sequential on the wire diverges). The providers now disagree until the
      entry is written again; each lost a different value.
    * ``ad_conflict_object``: search result entries whose DN carries ``\\0ACNF:<objectGUID>``, one
      finding per conflict object.

References: RFC 4533 (LDAP Content Synchronization: §2.3 Sync State, §2.5 Sync Info, §3.5 refresh and
persist), RFC 4530 (entryUUID), OpenLDAP Administrator's Guide 18.3.3 (multi-provider: "the most recent
change wins", by CSN), OpenLDAP slapd.conf(5) serverID, MS-ADTS 3.1.1.5.5.6.2 (name conflicts, CNF).

Known false positives / limits
    * Two writes of the same value: the digests agree, nothing was lost: no finding.
    * Writes to different attributes of one entry: when the winning version still carries the other
      write's value (a server that merges per attribute, delta-syncrepl) nothing is lost: no finding;
      when it does not, that value *was* lost (plain syncrepl ships whole entries) and is reported.
    * A write replicated twice (two consumers, a refresh after a reconnect): one CSN, one version.
    * Sequential writes (the second made after the first reached its provider) are ordinary
      overwrites, not conflicts: the arrival order on the wire says so.
    * The vantage point: only versions and pushes in the capture count; without the providers' links
      (a capture at the clients only) there are no versions and no finding. Encrypted replication
      (LDAPS, StartTLS, SASL with confidentiality) shows no CSNs: silent (ldap_messages.opaque says so).
    * The concurrency test compares capture times of the two servers' packets; a capture point far from
      both providers can misorder events closer together than its path delays: gaps within the
      timestamp resolution are at most ``low``.

Severity rule: ``lost_update`` is ``medium``; ``high`` when one entry lost ``high_repeats`` or more
updates in the capture (a systematic write fan-out to several providers), ``critical`` from
``critical_repeats``; at most ``low`` when the order rests on a gap within the timestamp resolution.
``divergence``: ``divergence_severity`` (high: the providers disagree). ``probable_lost_update``:
``unverified_severity``. ``ad_conflict_object``: ``cnf_severity``.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from . import replication_conflict_versions as rv
from .base import (NS_PER_MS, SEVERITIES, SEVERITY_RANK, empty_findings, findings, fmt_ns, optional_frame,
                   resolution_ns)
from .params import LOWER, UPPER, param

NAME = "replication_conflict"
KINDS = ("lost_update", "divergence", "probable_lost_update", "ad_conflict_object")
REQUIRES = ("ldap_sync", "ldap_transactions", "interfaces")
# what it reads of the transactions: a client write's outcome (replication_conflict_versions.writes)
COLUMNS = {"ldap_transactions": ("request_frame", "response_ts_ns", "response_frame", "result_code", "client",
                                 "client_port")}
ORDER = 55  # where it runs and is listed (detectors/__init__.py)


@dataclass(frozen=True)
class Params:
    """Thresholds of the replication conflict detector."""

    high_repeats: int = param(3, "lost updates on one entry from which each is high (writes fanned out to "
                                 "several providers systematically)", unit="updates", gate=LOWER, lo=1)
    critical_repeats: int = param(50, "... and critical", unit="updates", gate=LOWER, lo=1)
    fallback_delay_ns: int = param(100_000_000, "when the push of the earlier version to the other provider is not "
                                                "in the capture: two versions whose CSN times are closer than this "
                                                "are taken as concurrent (probable_lost_update); and the widest CSN gap "
                                                "of a pair that diverged without looking concurrent on the wire",
                                   unit="ns",
                                   gate=UPPER, lo=0)
    unverified_severity: str = param("low", "severity of a probable_lost_update (concurrency from CSN times, "
                                            "not from the wire)", choices=SEVERITIES)
    divergence_severity: str = param("high", "severity of a divergence (after concurrent writes a provider went back "
                                             "to the older version while the others kept the newer)",
                                     choices=SEVERITIES)
    cnf_severity: str = param("medium", "severity of an Active Directory CNF conflict object in search results",
                              choices=SEVERITIES)


MAX_VALUE_SHOWN = 60  # characters of a value quoted in an explanation


def _cap(sev: str, limit: str) -> str:
    return sev if SEVERITY_RANK[sev] <= SEVERITY_RANK[limit] else limit


def _q(v) -> str:
    s = "" if v is None else str(v)
    return repr(s if len(s) <= MAX_VALUE_SHOWN else s[:MAX_VALUE_SHOWN] + "...")


def conflicts(capture, params: Params = Params()) -> pl.DataFrame:
    """The concurrent version pairs of the capture with what each lost (one row per pair; ``verified``
    False for the CSN-time fallback). Empty when there is none. The proof chart reads this too."""
    sync = optional_frame(capture, "ldap_sync", nonempty=True)
    if sync is None:
        return pl.DataFrame()
    s = rv.entry_keys(sync)
    sids = rv.server_ids(s)
    ver, vals, arr = rv.versions(s)
    if ver.height < 2:
        return pl.DataFrame()
    ver = rv.match_writes(ver, rv.writes(s, optional_frame(capture, "ldap_transactions")), sids)
    p = rv.pairs(ver, arr, sids)
    if p.height == 0:
        return pl.DataFrame()
    wire = pl.col("arrival_ns").is_not_null() & pl.col("made_from_ns").is_not_null()
    gap = pl.col("n_csn_ts_ns") - pl.col("csn_ts_ns")
    p = p.with_columns(
        wire.alias("verified"),
        pl.when(wire).then((pl.col("arrival_ns") > pl.col("made_from_ns"))
                           & ((pl.col("arrival_ns") > pl.col("n_response_ts_ns")).fill_null(True)
                              | (pl.col("arrival_ns") > pl.col("n_csn_ts_ns")).fill_null(True)))
        .otherwise(gap.abs() < params.fallback_delay_ns).fill_null(False).alias("concurrent"),
        gap.alias("csn_gap_ns"),
        (pl.col("arrival_ns") - pl.col("csn_ts_ns")).alias("delay_ns"),
        (pl.col("arrival_ns") - pl.col("made_from_ns")).alias("margin_ns"))
    p = rv.reverted(p, s, arr)
    p = p.with_columns(pl.when(pl.col("reverted_frame").is_not_null()).then(pl.lit("older")).alias("diverged_how"))
    split = rv.split_versions(s).rename({"entry_csn": "n_entry_csn"})
    if split.height:  # two providers serve next's CSN with different values: diverged as well
        p = p.join(split, on=["key", "n_entry_csn"], how="left").with_columns(
            pl.coalesce("reverted_frame", "split_frame").alias("reverted_frame"),
            pl.coalesce("reverted_ns", "split_ns").alias("reverted_ns"),
            pl.coalesce("reverted_server", "split_server").alias("reverted_server"),
            pl.coalesce("diverged_how", pl.when(pl.col("split_frame").is_not_null()).then(pl.lit("split")))
            .alias("diverged_how")).drop(
            "split_frame", "split_ns", "split_server")
    # a divergence counts for a pair that is concurrent, or close enough to be (a consumer applying late)
    p = p.filter(pl.col("concurrent") | (pl.col("reverted_frame").is_not_null()
                                         & (pl.col("csn_gap_ns").abs() < params.fallback_delay_ns)))
    if p.height == 0:
        return pl.DataFrame()
    p = rv.lost_attributes(p, vals)
    return p.filter(pl.col("lost_attrs").is_not_null() & (pl.col("lost_attrs").list.len() > 0))


def _pair_rows(c: pl.DataFrame, params: Params, res_ns: float) -> list[dict]:
    rows = []
    per_key = {k: n for k, n in c.group_by("key").len().iter_rows()}
    for r in c.iter_rows(named=True):
        n_lost = per_key.get(r["key"], 1)
        if r["reverted_frame"] is not None:
            kind = "divergence"
            sev = params.divergence_severity
        elif r["verified"]:
            kind = "lost_update"
            sev = "critical" if n_lost >= params.critical_repeats else "high" if n_lost >= params.high_repeats \
                else "medium"
            if r["margin_ns"] is not None and abs(r["margin_ns"]) <= res_ns:
                sev = _cap(sev, "low")
        else:
            kind = "probable_lost_update"
            sev = params.unverified_severity
        attr = r["lost_attrs"][0]
        lost_v, kept_v = r["lost_values"][0], r["kept_values"][0]
        loser = (f"{r['w_client']}'s write on {r['w_server']} (frame {r['request_frame']})" if r["w_client"]
                 else f"the change on serverID {r['sid']}")
        winner = (f"{r['n_w_client']}'s write on {r['n_w_server']} (frame {r['n_request_frame']})"
                  if r["n_w_client"] else f"the change on serverID {r['n_sid']}")
        gap = r["csn_gap_ns"] or 0
        if r["verified"]:
            order = (f"the second write went to {r['n_server']} before the first change reached it (that push "
                     f"arrived in frame {r['arrival_frame']}, {fmt_ns(r['delay_ns'])} after its CSN, "
                     f"{fmt_ns(r['margin_ns'])} after the write was sent)")
        else:
            order = (f"the push of the earlier change to serverID {r['n_sid']} is not in the capture; the CSNs are "
                     f"{fmt_ns(abs(gap))} apart, less than {fmt_ns(params.fallback_delay_ns)} (fallback_delay_ns)")
        if kind == "divergence":
            seen = (f"still served the older version (CSN {r['entry_csn']}, frame {r['reverted_frame']}) after it "
                    f"had the newer one" if r["diverged_how"] == "older" else
                    f"served the newer CSN with other values than the other provider (frame {r['reverted_frame']})")
            outcome = (f": {r['reverted_server']} {seen}: the providers diverged, each lost one of the two values "
                       f"until the entry is written again")
        else:
            outcome = f": the later CSN (serverID {r['n_sid']}) wins on every provider and {_q(lost_v)} is lost"
        more = f" (and {len(r['lost_attrs']) - 1} more attribute(s))" if len(r["lost_attrs"]) > 1 else ""
        frames = [r["request_frame"], r["response_frame"], r["first_frame"], r["n_request_frame"],
                  r["n_response_frame"], r["n_first_frame"], r["arrival_frame"], r["reverted_frame"]]
        rows.append({
            "kind": kind, "severity": sev,
            "start_ns": min(x for x in (r["request_ns"], r["n_request_ns"], r["first_seen_ns"], r["n_first_seen_ns"])
                            if x is not None),
            "end_ns": max(x for x in (r["arrival_ns"], r["n_first_seen_ns"], r["first_seen_ns"], r["reverted_ns"])
                          if x is not None),
            "client": None if kind == "divergence" else r["w_client"],
            "server": (", ".join(sorted({x for x in (r["p_server"], r["n_server"]) if x})) or None)
            if kind == "divergence" else r["w_server"] or None, "resource": r["dn"],
            "clients": len({x for x in (r["w_client"], r["n_w_client"]) if x}) or None,
            "client_identity": "address",
            "metric": "csn_gap_ms", "value": abs(gap) / NS_PER_MS,
            "threshold": (r["delay_ns"] if r["delay_ns"] is not None else params.fallback_delay_ns) / NS_PER_MS,
            "unit": "ms",
            "evidence_frames": [int(f) for f in frames if f is not None],
            "explanation": (
                f"{r['dn']}: {loser} set {attr} = {_q(lost_v)} (CSN {r['entry_csn']}) and the version of {winner} "
                f"carries {_q(kept_v)} (CSN {r['n_entry_csn']}), {fmt_ns(abs(gap))} later by CSN; {order}{outcome}{more}"
                + (f" ({n_lost} lost updates of this entry in the capture)" if n_lost > 1 else "")),
        })
    return rows


def _cnf_rows(sync: pl.DataFrame, params: Params) -> list[dict]:
    c = sync.filter(pl.col("conflict_guid").is_not_null() & pl.col("kind").is_in(["entry", "sync_state"]))
    if c.height == 0:
        return []
    g = c.sort("ts_ns", "frame").group_by(rv.dn_key().alias("_dn"), maintain_order=True).agg(
        pl.col("dn").first(), pl.col("server").first(), pl.col("client").unique().sort().alias("clients"),
        pl.col("conflict_guid").first(), pl.col("ts_ns").min().alias("start"), pl.col("ts_ns").max().alias("end"),
        pl.col("frame").alias("frames"), pl.len().alias("n"))
    rows = []
    for r in g.iter_rows(named=True):
        rows.append({
            "kind": "ad_conflict_object", "severity": params.cnf_severity, "start_ns": r["start"], "end_ns": r["end"],
            "client": r["clients"][0] if len(r["clients"]) == 1 else None, "server": r["server"],
            "resource": r["dn"], "clients": len(r["clients"]), "client_identity": "address",
            "metric": "conflict_objects", "value": 1.0, "threshold": 1.0, "unit": "objects",
            "evidence_frames": [int(f) for f in r["frames"]],
            "explanation": (f"{r['server']} returned {r['dn']} ({r['n']} time(s)): an Active Directory replication "
                            f"name conflict object (CNF:, objectGUID {r['conflict_guid']}): two DCs created or renamed "
                            f"an object to the same name before replicating, and the loser was renamed "
                            f"(MS-ADTS 3.1.1.5.5.6.2)"),
        })
    return rows


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: lost updates across providers (concurrent versions of one entry) and Active Directory
    conflict objects (see the module doc)."""
    sync = optional_frame(capture, "ldap_sync", nonempty=True)
    if sync is None:
        return empty_findings()
    rows = _cnf_rows(sync, params)
    c = conflicts(capture, params)
    if c.height:
        rows += _pair_rows(c, params, resolution_ns(capture))
    if not rows:
        return empty_findings()
    return findings(pl.DataFrame(rows, infer_schema_length=None), detector=NAME, params=params)
