"""herd's keys for file-system requests (NFS): one key per path whatever the operation, and a second
per parent directory, so a checkpoint restart whose ranks open their own shards of one directory is one
herd on the directory (RFC 7530 §16.13 LOOKUP, §16.16 OPEN; RFC 1813 §3.3.3); one finding per herd
where it shows at both levels, and the words that name it. See detectors/herd.py ("File systems")."""
from __future__ import annotations

import polars as pl

from .base import protocol_declaration

FS_COLUMNS = ("path", "name")  # a transaction frame with both names files in directories (nfs_transactions)


def fs_protocols(frames: dict[str, pl.DataFrame]) -> set[str]:
    """Protocols whose transactions are file-system requests: their frame carries the resolved
    ``path`` and the ``name`` a LOOKUP/OPEN looks up in its directory (RFC 7530 §16.13, §16.16)."""
    return {str(f["protocol"][0]) for f in frames.values()
            if set(FS_COLUMNS) <= set(f.columns) and "protocol" in f.columns and f.height}


def parent_directory(resource: pl.Expr) -> pl.Expr:
    """The directory a path names its last component in: ``/a/b/c`` -> ``/a/b``, ``/a`` -> ``/``,
    ``fh:<hash>/name`` -> ``fh:<hash>`` (an unresolved directory handle); null for ``/`` and for a
    bare handle."""
    up = resource.str.replace(r"/[^/]*$", "")
    return (pl.when(resource.str.contains("/", literal=True) & (resource != "/"))
            .then(pl.when(up == "").then(pl.lit("/")).otherwise(up)))


def fs_keyed(req: pl.DataFrame, protocols: set[str]) -> pl.DataFrame:
    """The requests with their herd keys: ``key_operation`` (what "the same request" means with
    ``key_resource``), ``named`` (the resource the request itself names) and ``dir_row``.

    A file-system request (a protocol of ``protocols``, a resource, not one of the protocol's
    set-up operations) is keyed by its path whatever its operation: a client's LOOKUP, OPEN, READ
    and CLOSE of one file are one arrival (its repeats within ``repeat_ns``), as a Kerberos login's
    steps are; so is a client's set-up (the protocol's set-up operations share one key). It is also
    an arrival at its parent directory: a second row (``dir_row``) keyed by
    ``parent_directory``, so ranks that open their own shards in one directory, or look the
    directory up and then open files in it, are one herd on the directory. Other requests keep
    their operation in the key and get no second row."""
    setup = {p: set(d.setup_operations) for p in protocols if (d := protocol_declaration(p)) is not None}
    is_setup = pl.lit(False)
    for p, ops in setup.items():
        is_setup = is_setup | ((pl.col("protocol") == p) & pl.col("operation").is_in(sorted(ops)))
    is_fs = pl.col("protocol").is_in(sorted(protocols)) & pl.col("resource").is_not_null() & ~is_setup
    # a client's set-up (SETCLIENTID then SETCLIENTID_CONFIRM; EXCHANGE_ID, CREATE_SESSION ...) is
    # one arrival too: one key for all of a server's set-up operations
    req = req.with_columns(pl.when(is_fs).then(pl.lit("")).when(is_setup).then(pl.lit("\x1esetup"))
                           .otherwise(pl.col("operation")).alias("key_operation"),
                           pl.col("resource").alias("named"), pl.lit(False).alias("dir_row"),
                           is_fs.alias("fs_row"), is_setup.alias("setup_row"),
                           pl.when(is_fs).then(parent_directory(pl.col("resource"))).alias("_parent"))
    dirs = req.filter(pl.col("_parent").is_not_null()).with_columns(
        pl.col("_parent").alias("resource"), pl.col("_parent").alias("key_resource"), pl.lit(True).alias("dir_row"))
    return pl.concat([req, dirs]).drop("_parent")


def fs_names(hits: pl.DataFrame) -> pl.DataFrame:
    """Per episode: what its requests (the span's and its arrivals' repeats) name. ``names`` (distinct resources), ``operations`` (by
    count), and, over its directory rows (requests for something *in* the key's directory), the
    ``children`` named, the most-named one ``top_child`` and its share of the (client, name) uses
    ``top_child_share`` (null without directory rows) and ``top_child_clients``."""
    per = hits.group_by("seg").agg(pl.col("named").n_unique().alias("names"))
    ops = (hits.group_by("seg", "operation").len().sort("len", "operation", descending=[True, False])
           .group_by("seg", maintain_order=True).agg(pl.col("operation").alias("operations")))
    uses = hits.filter(pl.col("dir_row")).select("seg", "named", "client_id").unique()
    child = (uses.group_by("seg", "named").len().sort("len", "named", descending=[True, False])
             .group_by("seg", maintain_order=True).agg(
                 pl.col("named").n_unique().alias("children"), pl.col("named").first().alias("top_child"),
                 (pl.col("len").first() / pl.col("len").sum()).alias("top_child_share"),
                 pl.col("len").first().alias("top_child_clients")))
    return per.join(ops, on="seg", how="left").join(child, on="seg", how="left")


def one_per_tree(eps: pl.DataFrame, nested_share: float) -> pl.DataFrame:
    """One finding per herd where a file-system herd shows at two levels (a path and its parent
    directory: every request is an arrival at both). The directory's herd is dropped when one
    child carries at least ``nested_share`` of its (client, name) uses and that child's herd
    overlaps it (the herd is on the file: everyone opened ``model.pt``; or on a deeper directory:
    the path walk's LOOKUPs of the ancestors); otherwise the directory is the herd (ranks opening
    their own shards in it) and its overlapping child herds are dropped."""
    fs = eps.filter(pl.col("top_child_share").is_not_null() | pl.col("is_fs"))
    if fs.height < 2:
        return eps
    kids = fs.select("seg", "protocol", "server", "key_resource", "start_ns", "end_ns").with_columns(
        parent_directory(pl.col("key_resource")).alias("parent"))
    parents = fs.select(pl.col("seg").alias("pseg"), "protocol", "server", pl.col("key_resource").alias("parent"),
                        pl.col("start_ns").alias("p_start"), pl.col("end_ns").alias("p_end"), "top_child",
                        "top_child_share")
    pairs = kids.join(parents, on=["protocol", "server", "parent"], how="inner").filter(
        (pl.col("start_ns") <= pl.col("p_end")) & (pl.col("end_ns") >= pl.col("p_start")))
    on_child = pl.col("top_child_share").fill_null(0.0) >= nested_share
    drop_parents = pairs.filter(on_child & (pl.col("top_child") == pl.col("key_resource")))["pseg"]
    drop_kids = pairs.filter(~on_child)["seg"]
    return eps.filter(~pl.col("seg").is_in(pl.concat([drop_parents, drop_kids]).implode()))


def fs_words(r: dict, declared) -> tuple[str, str]:
    """(verb, what) of a file-system herd: the operations by the protocol's words ("lookup",
    "open"; others lower-cased), and the path, or the directory and how many names in it."""
    words = declared.operation_words if declared is not None else {}
    ops = [words.get(o, o.lower()) for o in (r.get("operations") or []) if o]
    if r.get("is_setup"):  # the set-up key: no resource, the protocol's words for it
        setup = declared.setup_words if declared is not None and declared.setup_words else "set-up"
        return f"sent {setup} requests ({', '.join(o for o in (r.get('operations') or []) if o)})", ""
    noun = (declared.requests_noun if declared is not None and declared.requests_noun else "requests")
    verb = f"sent {noun} ({', '.join(ops)}) for" if ops else "asked for"
    children = r.get("children") or 0
    if children > 1:
        k = r.get("top_child_clients") or 0
        top = (f" ({r['top_child']} by {'all' if k >= r['clients'] else k} of them)" if k > 1 else "")
        return verb, f"{children} different names in the directory {r['resource']}{top}"
    return verb, str(r["resource"])
