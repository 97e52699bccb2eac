"""The data of ``replication_conflict``: entry versions seen on the wire (one per entry and CSN), the
client writes that made them, when each version reached each provider, and the consecutive pairs of
versions of one entry from two different providers (see detectors/replication_conflict.py for the rules)."""
from __future__ import annotations

import polars as pl

# Operational attributes (RFC 4512 §3.4, OpenLDAP's entryCSN / entryDN / contextCSN, RFC 4530 entryUUID) that
# every change rewrites: never "the attribute that was lost".
OPERATIONAL = ("entrycsn", "entryuuid", "entrydn", "modifytimestamp", "modifiersname", "createtimestamp",
               "creatorsname", "structuralobjectclass", "subschemasubentry", "hassubordinates", "contextcsn",
               "numsubordinates", "pwdchangedtime", "authtimestamp")
VERSION_KINDS = ("sync_state", "entry")
WRITE_OPS = ("replace", "add", "increment", "delete")


def dn_key(col: str = "dn") -> pl.Expr:
    """DN normalised for comparison: lower case, no blanks around ``,`` and ``=`` (RFC 4514 §2)."""
    return pl.col(col).str.to_lowercase().str.replace_all(r"\s*([,=])\s*", "$1").str.strip_chars()


def entry_keys(sync: pl.DataFrame) -> pl.DataFrame:
    """``sync`` with ``key``: the entryUUID where the row or another row with the same DN shows it, else
    ``dn:<normalised DN>``; and ``dn_norm``."""
    s = sync.with_columns(dn_key().alias("dn_norm"))
    uuids = s.filter(pl.col("entry_uuid").is_not_null() & pl.col("dn_norm").is_not_null()) \
        .sort("ts_ns", "frame").group_by("dn_norm", maintain_order=True).agg(pl.col("entry_uuid").first().alias("_u"))
    s = s.join(uuids, on="dn_norm", how="left", maintain_order="left")
    return s.with_columns(pl.coalesce("entry_uuid", "_u", pl.format("dn:{}", pl.col("dn_norm"))).alias("key")) \
        .drop("_u")


def server_ids(sync: pl.DataFrame) -> pl.DataFrame:
    """address -> serverID: the ``sid`` of the cookies a provider sends (OpenLDAP puts its own serverID
    there), the most frequent one per address."""
    c = sync.filter(pl.col("cookie_sid").is_not_null() & pl.col("kind").is_in(["sync_state", "sync_info",
                                                                                  "sync_done"]))
    if c.height == 0:
        return pl.DataFrame(schema={"address": pl.String, "sid": pl.Int64})
    return c.group_by(pl.col("server").alias("address"), pl.col("cookie_sid").cast(pl.Int64).alias("sid")) \
        .len().sort("len", "address", "sid", descending=[True, False, False]) \
        .group_by("address", maintain_order=True).first().select("address", "sid")


def versions(s: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(versions, attribute values, arrivals). versions: one row per (key, entry_csn) with its origin
    sid, CSN time, first sighting (ts, frame), DN and the frames it was seen in; values: (key, csn,
    attr, digest, value) from the sighting with the most attributes; arrivals: (key, csn, consumer,
    arrival ts, frame): the first Sync State push of that version to each consumer."""
    v = s.filter(pl.col("kind").is_in(VERSION_KINDS) & pl.col("entry_csn").is_not_null()
                 & pl.col("csn_sid").is_not_null() & (pl.col("state").cast(pl.String).fill_null("") != "delete"))
    if v.height == 0:
        empty = pl.DataFrame(schema={"key": pl.String, "entry_csn": pl.String})
        return empty, empty, empty
    v = v.with_columns(pl.col("attributes").list.len().fill_null(0).alias("_nattr"))
    ver = v.sort("ts_ns", "frame").group_by("key", "entry_csn", maintain_order=True).agg(
        pl.col("csn_sid").first().cast(pl.Int64).alias("sid"), pl.col("csn_ts_ns").first(),
        pl.col("ts_ns").min().alias("first_seen_ns"), pl.col("frame").first().alias("first_frame"),
        pl.col("dn").first(), pl.col("frame").alias("frames"), pl.col("server").first().alias("seen_from"))
    best = v.sort("_nattr", "ts_ns", descending=[True, False]).group_by("key", "entry_csn", maintain_order=True) \
        .first().select("key", "entry_csn", "attributes", "value_digests", "values")
    vals = best.explode("attributes", "value_digests", "values").filter(pl.col("attributes").is_not_null()) \
        .select("key", "entry_csn", pl.col("attributes").str.to_lowercase().alias("attr"),
                pl.col("value_digests").alias("digest"), pl.col("values").alias("value"))
    arr = v.filter(pl.col("kind") == "sync_state").sort("ts_ns", "frame") \
        .group_by("key", "entry_csn", pl.col("client").alias("consumer"), maintain_order=True) \
        .agg(pl.col("ts_ns").first().alias("arrival_ns"), pl.col("frame").first().alias("arrival_frame"))
    return ver, vals, arr


def writes(s: pl.DataFrame, tx: pl.DataFrame | None) -> pl.DataFrame:
    """Client modify / add requests with their outcome (``ldap_transactions`` by request frame): key,
    server, client, request and response times, result, and the written attributes (lower case) with
    their value digests and first values."""
    w = s.filter(pl.col("kind").is_in(["modify", "add"]))
    if w.height == 0:
        return pl.DataFrame(schema={"key": pl.String, "server": pl.String})
    if tx is not None and tx.height:
        t = tx.select(pl.col("request_frame").alias("frame"), "response_ts_ns", "response_frame", "result_code",
                      pl.col("client").cast(pl.String).alias("_tc"), pl.col("client_port").alias("_cp"))
        w = w.join(t, on="frame", how="left", maintain_order="left")
    else:
        w = w.with_columns(pl.lit(None, pl.Int64).alias("response_ts_ns"), pl.lit(None, pl.UInt32)
                           .alias("response_frame"), pl.lit(None, pl.Int32).alias("result_code"))
    return w.select("key", "dn", "server", "client", "sport", pl.col("ts_ns").alias("request_ns"),
                    pl.col("frame").alias("request_frame"), "response_ts_ns", "response_frame", "result_code",
                    pl.col("attributes").list.eval(pl.element().str.to_lowercase()).alias("w_attrs"),
                    pl.col("ops").alias("w_ops"), pl.col("value_digests").alias("w_digests"),
                    pl.col("values").alias("w_values"))


def match_writes(ver: pl.DataFrame, w: pl.DataFrame, sids: pl.DataFrame) -> pl.DataFrame:
    """Each version with the successful client write that made it: the latest write to the same entry, on
    the server whose serverID is the version's sid, sent before the version was first seen."""
    if w.height == 0 or ver.height == 0 or sids.height == 0:
        return ver.with_columns(*[pl.lit(None, t).alias(c) for c, t in (
            ("w_client", pl.String), ("w_server", pl.String), ("request_ns", pl.Int64),
            ("request_frame", pl.UInt32), ("response_ts_ns", pl.Int64), ("response_frame", pl.UInt32),
            ("w_attrs", pl.List(pl.String)), ("w_ops", pl.List(pl.String)), ("w_digests", pl.List(pl.UInt64)),
            ("w_values", pl.List(pl.String)))])
    ok = w.filter(pl.col("result_code").fill_null(0) == 0).join(
        sids.rename({"address": "server"}), on="server", how="inner").sort("request_ns")
    right = ok.select("key", "sid", pl.col("client").alias("w_client"), pl.col("server").alias("w_server"),
                      "request_ns", "request_frame", "response_ts_ns", "response_frame", "w_attrs", "w_ops",
                      "w_digests", "w_values")
    # the writes consumed: a write makes one version (the first one seen after it)
    left = ver.sort("first_seen_ns")
    m = left.join_asof(right, left_on="first_seen_ns", right_on="request_ns", by=["key", "sid"],
                       strategy="backward", check_sortedness=False)
    dup = pl.col("request_frame").is_not_null() & pl.col("request_frame").is_duplicated()
    first = pl.col("first_seen_ns") == pl.col("first_seen_ns").min().over("request_frame")
    cols = [c for c in right.columns if c not in ("key", "sid")]
    return m.with_columns([pl.when(dup & ~first).then(None).otherwise(pl.col(c)).alias(c) for c in cols])


def pairs(ver: pl.DataFrame, arr: pl.DataFrame, sids: pl.DataFrame) -> pl.DataFrame:
    """Consecutive versions of one entry in CSN order (prev, next) from two serverIDs, with when prev
    reached next's provider (``arrival_ns``: null when that push is not in the capture) and when next was
    set going (``made_from_ns``: its client's write request, else its own first sighting)."""
    if ver.height == 0:
        return ver
    v = ver.sort("key", "entry_csn")
    nxt = [c for c in v.columns if c != "key"]
    v = v.with_columns([pl.col(c).shift(-1).over("key").alias(f"n_{c}") for c in nxt])
    p = v.filter(pl.col("n_entry_csn").is_not_null() & (pl.col("sid") != pl.col("n_sid")))
    if p.height == 0:
        return p
    addr = sids.group_by("sid").agg(pl.col("address").sort().first().alias("n_server"))
    p = p.join(addr.rename({"sid": "n_sid"}), on="n_sid", how="left") \
        .join(addr.rename({"sid": "sid", "n_server": "p_server"}), on="sid", how="left")
    p = p.join(arr.rename({"consumer": "n_server"}), on=["key", "entry_csn", "n_server"], how="left")
    return p.with_columns(pl.coalesce("n_request_ns", "n_first_seen_ns").alias("made_from_ns"))


def lost_attributes(p: pl.DataFrame, vals: pl.DataFrame) -> pl.DataFrame:
    """Per pair: the attributes prev changed (its write's, else every non-operational attribute whose value
    differs between the two versions) whose value next does not carry: ``lost`` (attribute, prev's value,
    next's value) lists; empty when both writes survive (same value, different attributes merged)."""
    if p.height == 0:
        return p.with_columns(pl.lit(None, pl.List(pl.String)).alias("lost_attrs"))
    pv = vals.rename({"entry_csn": "_pc", "digest": "p_digest", "value": "p_value"})
    nv = vals.rename({"entry_csn": "_nc", "digest": "n_digest", "value": "n_value"})
    idx = p.with_row_index("_pair").select("_pair", "key", pl.col("entry_csn").alias("_pc"),
                                           pl.col("n_entry_csn").alias("_nc"), "w_attrs", "w_ops", "w_digests",
                                           "w_values")
    a = idx.join(pv, on=["key", "_pc"], how="inner").join(nv, on=["key", "_nc", "attr"], how="left")
    a = a.filter(~pl.col("attr").is_in(list(OPERATIONAL)))
    by_write = pl.col("w_attrs").is_not_null() & (pl.col("w_attrs").list.len() > 0)
    changed = pl.when(by_write).then(pl.col("w_attrs").list.contains(pl.col("attr"))).otherwise(True)
    lost = a.filter(changed & (pl.col("n_digest").is_null() | (pl.col("n_digest") != pl.col("p_digest"))))
    agg = lost.sort("_pair", "attr").group_by("_pair", maintain_order=True).agg(
        pl.col("attr").alias("lost_attrs"), pl.col("p_value").alias("lost_values"),
        pl.col("n_value").alias("kept_values"))
    return p.with_row_index("_pair").join(agg, on="_pair", how="left").drop("_pair")


def reverted(p: pl.DataFrame, s: pl.DataFrame, arr: pl.DataFrame) -> pl.DataFrame:
    """Per pair: whether a provider served prev (an entry it returned carrying prev's CSN; or, for next's
    own provider, a push of prev) after it had next: next's own provider after next was first seen, any other provider
    after next's push reached it. That provider holds the older version while next's holds the newer:
    the providers diverged. Adds ``reverted_frame`` / ``reverted_ns`` / ``reverted_server`` (the first
    such sighting; null when none)."""
    none = [pl.lit(None, pl.UInt32).alias("reverted_frame"), pl.lit(None, pl.Int64).alias("reverted_ns"),
            pl.lit(None, pl.String).alias("reverted_server")]
    if p.height == 0:
        return p.with_columns(none)
    seen = s.filter(pl.col("kind").is_in(VERSION_KINDS) & pl.col("entry_csn").is_not_null()).select(
        "key", "entry_csn", pl.col("server").alias("_x"), pl.col("ts_ns").alias("_t"), pl.col("frame").alias("_f"),
        (pl.col("kind") == "entry").alias("_read"))
    idx = p.with_row_index("_pair")
    hit = idx.select("_pair", "key", "entry_csn", "n_entry_csn", "n_server", "n_first_seen_ns").join(
        seen, on=["key", "entry_csn"], how="inner")
    got = arr.select("key", pl.col("entry_csn").alias("n_entry_csn"), pl.col("consumer").alias("_x"),
                     pl.col("arrival_ns").alias("_had"))
    hit = hit.join(got, on=["key", "n_entry_csn", "_x"], how="left").with_columns(
        pl.when(pl.col("_x") == pl.col("n_server")).then(pl.col("n_first_seen_ns")).otherwise(pl.col("_had"))
        .alias("_since")).filter(pl.col("_since").is_not_null() & (pl.col("_t") > pl.col("_since"))
                                 # another provider's late push of its own older version is not a revert
                                 & (pl.col("_read") | (pl.col("_x") == pl.col("n_server"))))
    hit = hit.sort("_t", "_f").group_by("_pair", maintain_order=True).agg(
        pl.col("_f").first().alias("reverted_frame"), pl.col("_t").first().alias("reverted_ns"),
        pl.col("_x").first().alias("reverted_server"))
    return idx.join(hit, on="_pair", how="left").drop("_pair")


def split_versions(s: pl.DataFrame) -> pl.DataFrame:
    """Versions two providers serve with *different* values under one CSN (a non-operational attribute
    whose digest differs between the providers' sightings): (key, entry_csn, split_frame, split_ns,
    split_server), the first sighting that disagreed with an earlier one."""
    v = s.filter(pl.col("kind").is_in(VERSION_KINDS) & pl.col("entry_csn").is_not_null()
                 & pl.col("attributes").is_not_null())
    cols = {"key": pl.String, "entry_csn": pl.String, "split_frame": pl.UInt32, "split_ns": pl.Int64,
            "split_server": pl.String}
    if v.height == 0:
        return pl.DataFrame(schema=cols)
    a = v.select("key", "entry_csn", "server", "ts_ns", "frame", "attributes", "value_digests") \
        .explode("attributes", "value_digests").with_columns(pl.col("attributes").str.to_lowercase()) \
        .filter(~pl.col("attributes").is_in(list(OPERATIONAL))).sort("ts_ns", "frame")
    g = ["key", "entry_csn", "attributes"]
    a = a.with_columns(pl.col("value_digests").first().over(g).alias("_d0"),
                       pl.col("server").first().over(g).alias("_s0"))
    bad = a.filter((pl.col("value_digests") != pl.col("_d0")) & (pl.col("server") != pl.col("_s0")))
    return bad.group_by("key", "entry_csn", maintain_order=True).agg(
        pl.col("frame").first().alias("split_frame"), pl.col("ts_ns").first().alias("split_ns"),
        pl.col("server").first().alias("split_server")).select(list(cols)).cast(cols)
