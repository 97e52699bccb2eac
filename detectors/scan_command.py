"""The bodies of the commands that run the detectors: ``herdscope scan``, ``show`` and ``detectors``.

``analyzer/cli.py`` parses the arguments and calls these; they open the captures and check and write
the outputs through :mod:`analyzer.command` (the same one-line errors and exit codes as every other
command), run the detectors, and print through :mod:`detectors.report`, :mod:`detectors.show` and
:mod:`detectors.listing`.
"""
from __future__ import annotations

import contextlib
import functools
import json

import click
import polars as pl

from analyzer.command import open_captures, say_index_warning, writing
from analyzer.errors import ExitCode, UnreadableCapture, fail
from analyzer.mapped_frames import mapped
from analyzer.partitions import CONNECTION_FRAMES, CallerChunks, caller_packet_columns, packets_reader
from analyzer.shards import shard_frames
from analyzer.progress import stage
from analyzer.record_estimate import partitions_for
from analyzer.render import console as make_console
from analyzer.selection import SELECTION_COLUMNS
from analyzer.selection import apply as select
from analyzer.threads import at_most

from . import (ParameterError, at_least, available, configure, declared_columns_of, describe, detect_frames,
               detect_merged, detect_partition, expanded, frames_read_here, hand_over, incident_params, incidents,
               partitioned, population, required_frames, run, server_frames, server_read_columns, sharded,
               shortest_silence_ns, top_level)
from .base import PACKET_COLUMNS
from .incidents_evidence import DNS_FRAME, READS as LINKER_READS, RETAINED_PACKET_COLUMNS, dns_payloads
from .listing import print_detectors
from .report import capture_summary, finding_records, incident_records, render, render_table
from .scan_config import ScanConfig
from .show import check_id, find_finding, print_finding, tshark_summaries


# what a scan reads of the packets frame once the frames are built: the detectors' columns, the incident
# linker's (incidents.retain) and the report's (its count and span)
KEPT_PACKET_COLUMNS = tuple(dict.fromkeys(PACKET_COLUMNS + RETAINED_PACKET_COLUMNS))
# what a scan in partitions keeps of every packet while they decode, and of those only the span and the
# silences its own detectors read (Capture.thin_packets): the payload columns the linker reads of the
# DNS responses are kept of the packets to or from a DNS port alone (dns_payloads), and the addresses
# of the evidence frames are read again from the files at the end (partitions.packets_reader)
PARTITIONED_PACKET_COLUMNS = PACKET_COLUMNS
# what the caller of a partitioned scan reads of the packets at all: the columns above, and those the
# selection, the partitioning and the joining of pieces read; its workers decode (issue 13: the rest
# of a packet's ~90 bytes is never held by the caller)
CALLER_PACKET_COLUMNS = caller_packet_columns(*KEPT_PACKET_COLUMNS, *SELECTION_COLUMNS)
# what a partition's task reads of its packets once what reads the others is built: the detectors'
# columns (detect_partition puts the whole capture's in their place; the task keeps the addresses' Enum
# itself, analyzer.partitions.TASK_KEPT_PACKET_COLUMNS)
TASK_PACKET_COLUMNS = PACKET_COLUMNS


def scan(files, cfg: ScanConfig, selection, *, fmt: str, output: str | None, separate: bool, quiet: bool,
         expand: bool, workers: int | None = None, scheduler: str | None = None, partitions: int | None = None) -> int:
    """Run the detectors over ``files`` (one capture, or each on its own with ``separate``) and write
    the report; the exit code says whether a finding reached ``cfg.fail_on``. The options were
    checked by the caller (outputs are writable, parquet has an output) before this reads anything.
    With ``workers`` or ``scheduler`` the decoding runs on a Dask cluster (``analyzer.distributed``);
    with ``partitions`` alone, in that many server partitions one after the other in this process."""
    groups = [[f] for f in files] if separate else [list(files)]
    results, frames = [], []
    code = ExitCode.OK
    with contextlib.ExitStack() as stack:
        client = None
        if workers or scheduler:
            from analyzer import distributed  # lazy: only these options import Dask

            client = stack.enter_context(distributed.cluster(workers, scheduler))
        for group in groups:
            code = _scan_group(group, cfg, selection, client, scheduler is None, expand, results, frames, code,
                               partitions)
    with writing("--output", output):
        write_scan(results, frames, fmt, cfg.fail_on, output, quiet)
    return code


def _scan_group(group, cfg: ScanConfig, selection, client, local: bool, expand: bool, results, frames, code,
                partitions: int | None = None):
    """One capture of a scan: its report and findings appended to ``results`` and ``frames``; the exit
    code so far, updated. Without a cluster, more than one of ``partitions`` are decoded one after the
    other in this process; without ``partitions`` either, as many as the capture's estimated size
    asks (``analyzer.record_estimate.partitions_for``)."""
    if client is None:
        partitions = partitions_for(group, partitions)
        if partitions > 1:
            from analyzer.distributed import InProcess  # lazy: Dask itself is not imported

            client = InProcess()
    # one file, nothing selected: its reading keeps of each chunk of packets what the partitioned scan
    # reads of them (analyzer.partitions.CallerChunks); otherwise they are read whole and then narrowed
    chunked = None
    if client and len(group) == 1 and selection is None:
        # and, when the partitions are on this machine, the record index they read instead of walking the file
        chunked = CallerChunks(caller_silence_ns(configure(cfg.detectors, cfg.overrides)), dns_payloads,
                               record_index=local)
    try:
        cap = open_captures(group, packet_columns=CALLER_PACKET_COLUMNS if client else None, reduce=chunked)
    except UnreadableCapture as exc:
        fail(str(exc))
        return ExitCode.UNREADABLE
    say_index_warning(chunked)
    try:
        select(cap, selection)
        # before the partitions narrow the packets
        payloads = (dns_located(chunked) if chunked else dns_payloads(cap.packets)) if client else None
        addresses = packets_reader(cap, ("frame", "src", "dst")) if client else None  # and thin them
        found_elsewhere = decode_on_cluster(client, cap, cfg, local=local, partitions=partitions) if client else None
        linker = linker_params(cfg)
        kept = incidents.retain(cap, required_frames(cfg.detectors), payloads, addresses)  # what release would free
        # in partitions, the caller's detectors on the merged frames too run one at a time (analyzer.threads)
        with at_most(1) if client else contextlib.nullcontext():
            findings = run_detectors(cap, cfg, release=True, found_elsewhere=found_elsewhere)
        stage("incidents")
        linked = incidents.link(findings, cap, linker, retained=kept)
        listed = expanded(findings) if expand else top_level(findings)  # populations' members: --expand
        names = cfg.detectors or list(available())
        label = "+".join(group)
        for warning in cap.warnings:
            fail(f"warning: {warning}")
        summary = capture_summary(cap, group, top_level(findings), names)
        summary["warnings"] = list(cap.warnings)  # files read once, pieces overlapping or with a gap
        results.append((summary, finding_records(listed, label, cap, linked), incident_records(linked, label)))
        part_of = incidents.incident_of(linked)
        incident = pl.col("finding_id").replace_strict(part_of, default=None, return_dtype=pl.String)
        frames.append(listed.with_columns(pl.lit(label).alias("capture"), incident.alias("incident")))
        if at_least(top_level(findings), cfg.fail_on).height and code == ExitCode.OK:
            code = ExitCode.FINDINGS
    finally:
        cap.close()  # and what its reading wrote to disk (a record index), whatever failed
    return code


def dns_located(chunked: CallerChunks) -> pl.DataFrame | None:
    """Where the DNS packets are in the capture, as a chunked reading extracted them (``dns_payloads``),
    held to the run's end by the incident linker: in a mapped file (``analyzer.mapped_frames``), the
    chunks let go of (16 bytes a DNS packet: ~530 MB at 100M synth packets)."""
    located = chunked.take_extracted()
    return mapped(located) if located is not None else None


def decode_on_cluster(client, cap, cfg: ScanConfig, *, local: bool, partitions: int | None = None
                      ) -> dict[str, pl.DataFrame]:
    """Decode on the cluster: the workers build the frames, run the detectors that declare a server
    PARTITION on their partition (:func:`detectors.detect_partition`), those partitioned by client on
    the client buckets (:func:`detectors.detect_frames`), and send back those detectors' findings and
    the frames the others (and the population step, and the incident linker's DNS evidence) read
    here, which ``cap`` is given. Returns the findings found on the workers."""
    from analyzer import distributed
    from analyzer.capture import READER_FRAMES

    stage("decode on the cluster")
    configured = configure(cfg.detectors, cfg.overrides)
    names = list(configured)
    on_workers, by_client = partitioned(names, "server"), partitioned(names, "client")
    here = set(frames_read_here(names, on_workers + by_client)) | ({DNS_FRAME} & set(required_frames(names)))
    shipped = [n for n in required_frames(names) if n in here and n not in READER_FRAMES]
    then = functools.partial(detect_partition, names=on_workers, overrides=cfg.overrides) if on_workers else None
    # a server cut into shards of its clients (analyzer.shards): the detectors that judge each
    # connection alone run on each shard, the others on what the shards hand over, merged
    on_shards = sharded(on_workers)
    on_server = [n for n in on_workers if n not in on_shards]
    shard_then = functools.partial(detect_partition, names=on_shards, overrides=cfg.overrides) if on_shards else None
    handing = functools.partial(hand_over, names=on_server) if on_server else None
    server_then = functools.partial(detect_merged, names=on_server, overrides=cfg.overrides) if on_server else None
    bucket_then = functools.partial(detect_frames, names=by_client, overrides=cfg.overrides) if by_client else None
    # a client bucket is cut by the connections' clients: the connections always go in
    bucketed = tuple(dict.fromkeys(["connections", *(n for n in required_frames(by_client) if n in CONNECTION_FRAMES)]))
    shared = {"frames": {"interfaces": cap.frame("interfaces")}, "path": cap.path, "files": cap.files,
              "pieces": cap.pieces, "warnings": cap.warnings}
    return distributed.decode_into(client, cap, shipped, local=local, then=then, client_frames=bucketed,
                                   client_then=bucket_then, shared=shared, packet_columns=PARTITIONED_PACKET_COLUMNS,
                                   partitions=partitions,
                                   silence_ns=shortest_silence_ns({n: configured[n] for n in on_workers}),
                                   task_frames=tuple(dict.fromkeys((*required_frames(on_workers),
                                                                    *shard_frames(server_frames(on_server))))),
                                   task_packet_columns=TASK_PACKET_COLUMNS,
                                   frame_columns=_read_columns(names),
                                   caller_columns=caller_columns(names, on_workers + by_client, shipped),
                                   caller_silence_ns=caller_silence_ns(configured), shard_then=shard_then,
                                   hand_over=handing, server_then=server_then,
                                   server_frames=server_read_columns(on_server))


def caller_silence_ns(configured: dict[str, object]) -> int | None:
    """The shortest silence the detectors of ``configured`` (name -> Params, ``detectors.configure``)
    that a scan in partitions runs in its calling process (those partitioned by neither server nor
    client) read: what the caller keeps of its packets' times."""
    elsewhere = set(partitioned(list(configured), "server")) | set(partitioned(list(configured), "client"))
    return shortest_silence_ns({n: p for n, p in configured.items() if n not in elsewhere})


def caller_columns(names: list[str], found_elsewhere: list[str], shipped: list[str]) -> dict[str, tuple[str, ...]]:
    """Of the frames ``shipped`` to the caller of a scan of ``names`` in partitions, what the caller reads
    of them, where all its readers declare theirs (COLUMNS, base.py): the detectors that run there (not
    ``found_elsewhere``), the population step where one of ``names`` declares a POPULATION, and the
    incident linker (its DNS evidence, incidents_evidence.READS). The tasks send no more of them
    (``analyzer.distributed.decode_frames``): on the 10M synth capture the merged frames the caller held
    were 190 MB, ``dns_transactions`` (107 B a row, read by the linker alone) and ``ldap_transactions``
    (236 B a row) most of it."""
    detectors = available()
    readers = [detectors[n] for n in names if n not in found_elsewhere] + [LINKER_READS]
    if any(getattr(detectors[n], "POPULATION", None) for n in names):
        readers.append(population)
    return {frame: tuple(sorted(wanted)) for frame, wanted in declared_columns_of(readers, shipped).items()}


def _read_columns(names: list[str]) -> dict[str, tuple[str, ...]]:
    """frame -> the columns of it a scan of detectors ``names`` reads, wherever they run (on the
    partitions, the client buckets or here), where all its readers declare theirs (COLUMNS, base.py);
    a partition's task keeps the merges' keys besides (analyzer.partitions.MERGE_KEY_COLUMNS)."""
    modules = [available()[n] for n in names] + [population]
    declared = declared_columns_of(modules, required_frames(names))
    return {frame: tuple(sorted(wanted)) for frame, wanted in declared.items()}


def run_detectors(cap, cfg: ScanConfig, *, release: bool, found_elsewhere=None) -> pl.DataFrame:
    """The findings of ``cfg``'s detectors and parameters over ``cap`` (:func:`detectors.run`; a scan,
    which needs nothing of the capture afterwards, with ``release``); a parameter the detectors refuse
    (ParameterError) is a usage error, as every command that runs them reports it."""
    try:
        return run(cap, only=cfg.detectors, overrides=cfg.overrides, release=release, found_elsewhere=found_elsewhere)
    except ParameterError as exc:
        raise click.UsageError(str(exc)) from exc


def linker_params(cfg: ScanConfig) -> incidents.Params:
    """The incident linker's parameters (``incident.*`` of ``--set``/``--config``); a bad one is a usage error."""
    try:
        return incident_params(cfg.overrides)
    except ParameterError as exc:
        raise click.UsageError(str(exc)) from exc


def write_output(output: str | None, quiet: bool, *, table=None, text=None) -> None:
    """A command's report on standard output or in ``output`` (nothing on stdout with ``quiet``):
    ``table(console)`` prints itself on a console (None: standard output's), else ``text()`` is the text."""
    if quiet and not output:
        return
    if table is not None:
        if output:
            with open(output, "w") as fh:
                table(make_console(fh))
        else:
            table(None)
        return
    body = text()
    if output:
        with open(output, "w") as fh:
            fh.write(body)
    else:
        click.echo(body, nl=False)


def write_scan(results, frames, fmt, fail_on, output, quiet) -> None:
    """The report in ``fmt`` on standard output or in ``output`` (nothing on stdout with ``quiet``)."""
    if fmt == "parquet":  # --output is required with parquet (checked by the caller)
        (pl.concat(frames) if frames else pl.DataFrame()).write_parquet(output)
        return
    write_output(output, quiet, table=(lambda console: render_table(results, fail_on, console)) if fmt == "table"
                 else None, text=lambda: render(results, frames, fmt, fail_on))


def show(finding_id: str, files, cfg: ScanConfig, *, fmt: str, use_tshark: bool) -> int:
    """One finding in full (``herdscope show``); an id that is no finding here is a usage error."""
    why = check_id(finding_id)
    if why:
        raise click.UsageError(why)
    with open_captures(list(files)) as cap:
        found = find_finding(cap, files, finding_id, cfg)
    if isinstance(found, str):
        raise click.UsageError(found)
    record, members = found
    summaries = tshark_summaries(record) if use_tshark else None
    if fmt == "json":
        click.echo(json.dumps({**record, "tshark": summaries, "member_findings": members}, indent=1))
    else:
        print_finding(record, members, summaries)
    return ExitCode.OK


def list_detectors(names: tuple[str, ...], fmt: str) -> int:
    """``herdscope detectors [NAME...]``: every detector (or those named) with its parameters."""
    rows = describe()
    known = [r["name"] for r in rows]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.UsageError(f"unknown detector(s): {', '.join(unknown)} (known: {', '.join(known)})")
    rows = [r for r in rows if not names or r["name"] in names]
    if fmt == "json":
        click.echo(json.dumps({"detectors": rows}, indent=1))
    else:
        print_detectors(rows)
    return ExitCode.OK
