"""The ``herdscope`` command: the entry point, which parses the arguments and dispatches.

``main(argv)`` returns an :class:`ExitCode` so tests call it in-process (pytest's own pattern).
The commands over the capture itself (``info``, ``stats``, ``export``) are written here with the
analyzer's own functions; those that run the detectors (``scan``, ``show``, ``detectors``) are in
``detectors/scan_command.py``, ``dashboard`` in ``dashboards/launch.py``. This module is the one
place of ``analyzer/`` that reaches those upper layers (``tests/test_layers.py`` checks it), and it
imports them inside the commands so that ``herdscope --help`` loads neither Polars nor Numba.

Every failure a user can act on is one line on standard error, ``herdscope: ...``, and an exit code
that means one thing: a traceback only ever comes with exit 4 (a bug). Outputs (``--output``,
``--out``) are checked before any capture is read. When standard output is closed early
(``herdscope scan x.pcap | head -1``) herdscope stops quietly with 141 (128 + SIGPIPE), the status a
shell reports for a process that SIGPIPE ended, as ``yes | head`` does: never 1 (findings) or 0.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import sys
import traceback

import click

from . import __version__
from .command import check_output_dir, check_output_file, each_capture, open_captures, writing
from .errors import ClusterFailure, ExitCode, HerdscopeError, OutputError, Terminated, UnreadableCapture, fail
from .threads import configured_threads


def exit_codes_help(*, findings: bool = False, writes: bool = False, reads: bool = True,
                    usage: str = "", success: str = "") -> str:
    """The exit codes a command can return, for its --help (only those); ``usage`` adds a case of 2,
    ``success`` says what 0 covers."""
    note = " (no finding reached --fail-on)" if findings else f" ({success})" if success else ""
    lines = ["\b", "Exit codes:", "  0  success" + note]
    if findings:
        lines.append("  1  findings at or above --fail-on")
    lines.append("  2  usage error (bad option, missing argument" + (", an output that cannot be written"
                                                                    if writes else "") + usage + ")")
    if reads:
        lines.append("  3  unreadable input (missing, a directory, not a pcap/pcapng, no packet readable)")
    lines += ["  4  internal error (a bug: please report it with the traceback)",
              "  141  standard output closed early (| head); 130 interrupted; 143 terminated"]
    return "\n".join(lines)


EXIT_CODES_HELP = exit_codes_help(findings=True, writes=True)  # all of them (the command group)

# A capture argument: "-" is standard input; whether it exists or can be read is left to the reader,
# which says so in one line with exit 3 (click's own check would make an unreadable file a usage error).
CAPTURE_PATH = click.Path(allow_dash=True, readable=False)


class _StdoutClosed(Exception):
    """Standard output was closed while a command wrote to it (not an OSError, so that click's own
    handling, which exits 1, lets it through to :func:`main`)."""


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise _StdoutClosed() from exc
            raise
        except SystemExit as exc:
            # rich's Console answers a closed pipe with SystemExit(1) (Console.on_broken_pipe), which
            # would read as "findings": it is the closed pipe.
            if isinstance(exc.__context__, BrokenPipeError):
                raise _StdoutClosed() from exc
            raise


@click.group(cls=_Group, help=f"Find timing pathologies in packet captures.\n\n{EXIT_CODES_HELP}",
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="herdscope")
def cli() -> None:
    try:  # a bad HERDSCOPE_THREADS is the user's setting, said before any capture is read (analyzer.threads)
        configured_threads()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


# the default of --partitions (analyzer.record_estimate.automatic_partitions; tests/test_record_estimate.py
# checks the figures against its constants)
DEFAULT_PARTITIONS_HELP = ("Default: 1 for a capture of fewer than 5M packets (estimated from a sample of its "
                           "records), one per 2.5M packets (at most 16) for a larger one; --partitions 1 decodes "
                           "it at once")


# the most partitions (analyzer.partitions.partition_ids: a packet's partition is a uint16, its last
# value meaning "not selected"), written out so that --help loads no NumPy (tests/test_partitioned_commands.py)
MAX_PARTITIONS = 65534


def partitions_option(what_is_the_same: str, where: str = ""):
    """--partitions of a command that decodes in server partitions (info, stats; scan, which says
    ``where`` else they may be decoded)."""
    return click.option("--partitions", type=click.IntRange(min=1, max=MAX_PARTITIONS), metavar="N",
                        help=f"decode in N server partitions, one after the other{where}: memory holds about the "
                             f"largest partition's decoding, not the whole capture's, and the files are read N more "
                             f"times; {what_is_the_same} the same. {DEFAULT_PARTITIONS_HELP}")


@cli.command(help=f"Summarise captures like capinfos: format, link types, packets, times, "
                  f"protocols, damage.\n\n{exit_codes_help()}")
@click.argument("files", nargs=-1, required=True, type=CAPTURE_PATH)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: one object per file, one per line (the README lists its keys)")
@partitions_option("the summary is")
def info(files: tuple[str, ...], fmt: str, partitions: int | None) -> int:
    from .render import print_summary  # lazy: loads rich, and the summary Polars (not for --help)
    from .summary import PARTITIONED_PACKET_COLUMNS, chunked_reading, summarize_in_partitions  # lazy: loads Polars

    refuse_rereading(files, partitions)

    def show(path, cap, count):
        summary = summarize_in_partitions(cap, count)
        if fmt == "json":
            click.echo(json.dumps(summary, sort_keys=False))
        else:
            print_summary(summary)

    return each_capture(files, show, partitions=partitions, packet_columns=PARTITIONED_PACKET_COLUMNS,
                        chunked=chunked_reading)


@cli.command(help=f"Write the frames of a capture as Parquet files, one per frame, plus "
                  f"schema.json (a description of every column) and read_report.json.\n\n"
                  f"{exit_codes_help(writes=True)}")
@click.argument("file", type=CAPTURE_PATH)
@click.option("--out", "out_dir", required=True, type=click.Path(),
              help="directory to write into (created if missing)")
@click.option("--frames", default="all", show_default=True,
              help="comma-separated frame names to write, or 'all'")
@click.option("--compression", type=click.Choice(["lz4", "zstd", "snappy", "uncompressed"]), default="lz4",
              show_default=True, help="Parquet compression (zstd: smaller, slower to write)")
def export(file: str, out_dir: str, frames: str, compression: str) -> int:
    from .export import export_frames  # lazy: loads the reader and Polars (not for --help)

    wanted = None if frames.strip() == "all" else [f.strip() for f in frames.split(",") if f.strip()]
    if wanted is not None and not wanted:  # `--frames ''` is a mistake, not "all"
        raise click.UsageError("--frames: no frame named (a comma-separated list, or 'all')")
    check_output_dir("--out", out_dir)
    try:
        with open_captures([file]) as cap, writing("--out", out_dir):
            written = export_frames(cap, out_dir, wanted, compression)
    except UnreadableCapture as exc:
        fail(str(exc))
        return ExitCode.UNREADABLE
    except KeyError as exc:
        fail(str(exc.args[0]))
        return ExitCode.USAGE
    width = max((len(name) for name, _, _ in written), default=0)
    for name, path, rows in written:
        click.echo(f"{name:<{width}} {rows:>10,} rows  {path}", err=True)
    return ExitCode.OK


STATS_HELP = ("Service response times per protocol and operation (DNS, Kerberos, LDAP, SMB2): count, answered, "
              "unanswered, errors and min/p50/p90/p99/max latency, with SMB2 STATUS_PENDING waits and "
              "oplock/lease break acknowledgments on rows of their own. A caching or forwarding DNS resolver's "
              "two legs are kept apart in the leg column: client_to_resolver, resolver_to_upstream, or direct "
              "(a resolver is an address that answers DNS queries on port 53 and itself sends queries to "
              "another port-53 server in the capture).")
STATS_EXIT_CODES = exit_codes_help(success="a capture without transactions too: a notice on standard error says so")


class _StatsCommand(click.Command):
    """``stats``, whose help adds the decoders' rules for errors and unanswered requests, read from them
    when the help is shown (plain ``herdscope --help`` does not load the decoders)."""

    def get_help(self, ctx: click.Context) -> str:
        from .stats import outcome_help  # lazy: loads the decoders, only when the help is shown

        self.help = f"{STATS_HELP}\n\n{outcome_help()}\n\n{STATS_EXIT_CODES}"
        return super().get_help(ctx)


def selection_options(command):
    """--start, --end, --host, --port: the packets analysed (scan, stats), applied before the analysis."""
    for option in reversed((
        click.option("--start", metavar="TIME", help="only packets at or after TIME: seconds after the first "
                                                    "packet (12.5) or ISO 8601 (2026-11-29T18:34:09Z)"),
        click.option("--end", metavar="TIME", help="only packets at or before TIME (as --start)"),
        click.option("--host", "hosts", multiple=True, metavar="ADDR",
                     help="only packets from or to this address; repeat for several"),
        click.option("--port", "ports", multiple=True, type=int, metavar="PORT",
                     help="only packets from or to this TCP/UDP port; repeat for several"),
    )):
        command = option(command)
    return command


def refuse_rereading(files, partitions: int | None, *, cluster: bool = False) -> None:
    """A usage error when a file can be read only once (standard input, a FIFO) and the options read
    the files again in each partition."""
    if not cluster and (partitions or 1) <= 1:
        return
    from .source import read_once  # lazy: NumPy, which --help does not load

    streamed = [f for f in files if read_once(f)]
    if streamed:
        name = "standard input" if streamed[0] == "-" else streamed[0]
        options = "--workers, --scheduler and --partitions" if cluster else "--partitions"
        raise click.UsageError(f"{name} can be read only once, and {options} read the files again in each "
                               f"partition: save it to a file first")


def parse_selection(start, end, hosts, ports):
    from .selection import Selection, SelectionError  # lazy: only commands that select load it

    try:
        return Selection.from_options(start, end, hosts, ports)
    except SelectionError as exc:
        raise click.UsageError(str(exc)) from exc


@cli.command(cls=_StatsCommand, help=STATS_HELP)
@click.argument("files", nargs=-1, required=True, type=CAPTURE_PATH)
@click.option("--by", type=click.Choice(["server", "client"]), default=None,
              help="also one row per server (or per client) address")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True,
              help="json: one object per file and line, {file, by, selection, stats: [row...]}, each row with the keys "
                   "protocol, operation, leg, server, client (null unless --by), count, answered, unanswered, "
                   "errors, min, p50, p90, p99, max, mean (latencies in ns); csv: the same columns after a "
                   "file column, one header line")
@selection_options
@partitions_option("the response times are")
def stats(files: tuple[str, ...], fmt: str, by: str | None, start, end, hosts, ports, partitions) -> int:
    from .selection import apply as select  # lazy: loads Polars (not for --help)
    from .stats import (  # lazy: loads the decoders and Polars (not for --help)
        PARTITIONED_PACKET_COLUMNS, chunked_reading, csv_text, decode_response_time_frames, no_transactions_message,
        records, render_table, service_response_times)

    header = [True]
    selection = parse_selection(start, end, hosts, ports)
    refuse_rereading(files, partitions)

    def show(path, cap, count):
        select(cap, selection)
        if cap.selection and fmt == "table":
            fail(f"{path}: selected {cap.selection['packets_selected']:,} of "
                  f"{cap.selection['packets_total']:,} packets")
        decode_response_time_frames(cap, count)
        table = service_response_times(cap, by)
        if table.height == 0:
            fail(no_transactions_message(path, cap))
        if fmt == "json":
            click.echo(json.dumps({"file": path, "by": by, "selection": cap.selection,
                                   "stats": records(table).to_dicts()}))
        elif fmt == "csv":
            click.echo(csv_text(table, path, header[0]), nl=False)
            header[0] = False
        elif table.height:
            render_table(table, f"Service response times{' by ' + by if by else ''}: {path}")

    # a selection is applied to the packets read whole; otherwise each chunk is kept only as partitions
    return each_capture(files, show, partitions=partitions, packet_columns=PARTITIONED_PACKET_COLUMNS,
                        chunked=chunked_reading if selection is None else None)


# detectors.base.SEVERITIES, written out so that --help loads no detector (tests/test_layers.py checks both agree)
SEVERITY_CHOICES = ["informational", "low", "medium", "high", "critical"]


def detector_options(command):
    """--detectors, --config and --set: which detectors run and with what parameters (scan, show)."""
    for option in reversed((
        click.option("--detectors", "detector_list", metavar="A,B",
                     help="run only these detectors (`herdscope detectors` lists them)"),
        click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
                     help="TOML file: [scan] detectors/fail_on, and [DETECTOR] parameter tables"),
        click.option("--set", "sets", multiple=True, metavar="DETECTOR.PARAM=VALUE",
                     help="override a detector parameter; repeat for several (durations take units: "
                          "herd.window_ns=250ms, 1s, 20us; `herdscope detectors` lists every parameter)"),
    )):
        command = option(command)
    return command


@cli.command(help=f"Run the detectors over captures and report findings.\n\n"
                  f"Several files are analysed as one capture (the pieces of a ring buffer, put in the order "
                  f"of their first packets; evidence names each file with that file's own frame numbers), or "
                  f"each on its own with --separate. The JSON/NDJSON schema is in "
                  f"the README.\n\n{exit_codes_help(findings=True, writes=True)}")
@click.argument("files", nargs=-1, required=True, type=CAPTURE_PATH)
@detector_options
@selection_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "ndjson", "parquet", "junit"]),
              default="table", show_default=True)
@click.option("--output", "output", type=click.Path(), help="write to this file (stdout otherwise)")
@click.option("--fail-on", "fail_on", type=click.Choice(SEVERITY_CHOICES), default=None,
              help="exit 1 when a finding reaches this severity (default: high)")
@click.option("--separate", is_flag=True, help="analyse each file on its own")
@click.option("--quiet", "-q", is_flag=True,
              help="print nothing on standard output (as grep -q): the exit code says whether a finding "
                   "reached --fail-on; errors still go to standard error, --output files are still written")
@click.option("--expand", is_flag=True,
              help="also list each population finding's members (the per-client or per-connection findings it "
                   "stands for) beneath it; without it they are left out (member_ids names them) and never "
                   "count for --fail-on")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="decode on a local Dask cluster of N worker processes, one server partition each; the "
                   "findings are the same (needs pip install 'herdscope[distributed]')")
@click.option("--scheduler", metavar="tcp://HOST:8786",
              help="decode on the Dask cluster of this scheduler instead (its workers must be able to open "
                   "the files at the same paths)")
@partitions_option("the findings are", where=" (or, with --workers/--scheduler, on the workers; default there 2 "
                                              "per worker)")
def scan(files, detector_list, config_path, sets, start, end, hosts, ports, fmt, output, fail_on, separate, quiet,
         expand, workers, scheduler, partitions) -> int:
    from detectors.scan_command import scan as scan_captures  # lazy: the detectors load Polars and Numba
    from detectors.scan_config import scan_config  # lazy: as above

    cfg = scan_config(config_path, sets, detector_list, fail_on)
    selection = parse_selection(start, end, hosts, ports)
    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet needs --output PATH")
    if workers and scheduler:
        raise click.UsageError("--workers and --scheduler exclude each other (a local cluster, or an existing one)")
    check_output_file("--output", output)
    refuse_rereading(files, partitions, cluster=bool(workers or scheduler))
    return scan_captures(files, cfg, selection, fmt=fmt, output=output, separate=separate, quiet=quiet,
                         expand=expand, workers=workers, scheduler=scheduler, partitions=partitions)


# detectors.diff_gate.GateParams' fields, written out so that --help loads no detector (tests/test_diff.py
# checks both agree); their defaults and meanings are read from GateParams when the help is shown
GATE_OPTIONS = ("max_p50_increase", "max_p99_increase", "max_error_share_increase", "max_unanswered_share_increase",
                "fail_on_new", "max_retransmission_increase", "max_connection_rate_increase", "confidence",
                "min_samples", "min_connections", "min_data_segments")
DIFF_HELP = ("Compare two captures and gate on the change: AFTER worse than BEFORE beyond the thresholds exits 1. "
             "Per protocol, operation and leg the service response times of `stats` (count, error and "
             "unanswered share, p50 and p99 with distribution-free confidence intervals: a latency change "
             "counts only when significant, and rows with too few samples are not gated); per detector, "
             "findings new, gone or changed in severity (matched by detector, kind, server and resource, "
             "not by time); TCP new-connection and retransmission rates. BEFORE and AFTER are each a "
             "capture file or a directory whose files are read as one capture (ring-buffer pieces). "
             "Thresholds: ratios as 20% or 0.2, shares in points as +1pp, severities by name; `off` turns "
             "one off. The JSON keys are in the README.")


class _DiffCommand(click.Command):
    """``diff``, whose help gives each gate option's default and meaning, read from
    ``detectors.diff_gate.GateParams`` when the help is shown (plain ``--help`` loads no detector)."""

    def get_help(self, ctx: click.Context) -> str:
        from detectors.diff_gate import GATE_FIELDS, format_threshold, spec_of  # lazy: loads Polars (help only)

        for p in self.params:
            if p.name in GATE_FIELDS:
                field = GATE_FIELDS[p.name]
                p.help = f"{spec_of(field).help} (default {format_threshold(field.name, field.default)})"
        return super().get_help(ctx)


def gate_options(command):
    """The gate thresholds of ``diff`` (:data:`GATE_OPTIONS`): raw text, parsed by detectors.diff_gate."""
    for name in reversed(GATE_OPTIONS):
        command = click.option("--" + name.replace("_", "-"), name, default=None, metavar="VALUE")(command)
    return command


@cli.command(cls=_DiffCommand, help=f"{DIFF_HELP}\n\n" + exit_codes_help(writes=True, usage=", a bad threshold")
             .replace("  2  usage", "  1  the gate failed: AFTER is worse than BEFORE beyond a threshold\n  2  usage"))
@click.argument("before", type=CAPTURE_PATH)
@click.argument("after", type=CAPTURE_PATH)
@detector_options
@selection_options
@gate_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "junit"]), default="table", show_default=True,
              help="json: one document (before, after, srt, findings, rates, gate); junit: one test case per "
                   "gate check")
@click.option("--output", "output", type=click.Path(), help="write to this file (stdout otherwise)")
@click.option("--quiet", "-q", is_flag=True, help="print nothing on standard output: the exit code answers")
def diff(before, after, detector_list, config_path, sets, start, end, hosts, ports, fmt, output, quiet,
         **thresholds) -> int:
    from detectors.diff_command import diff as diff_captures  # lazy: the detectors load Polars and Numba
    from detectors.diff_gate import gate_params  # lazy: as above
    from detectors.scan_config import scan_config  # lazy: as above

    cfg = scan_config(config_path, sets, detector_list, None)
    selection = parse_selection(start, end, hosts, ports)
    try:
        params = gate_params(thresholds)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    check_output_file("--output", output)
    return diff_captures(before, after, cfg, selection, params, fmt=fmt, output=output, quiet=quiet)


@cli.command(help="Show one finding in full: its explanation and numbers, every evidence frame (per file, "
                  "not capped), the Wireshark commands that open them, tshark's one-line summary of each "
                  "evidence frame when tshark is installed, and, for a population finding, its members. "
                  "FINDING_ID is the id scan printed (or a unique prefix of it, at least 4 hex digits); "
                  "give the same files and detector options as to scan (ids depend on both).\n\n"
                  + exit_codes_help(usage=", an id that is no finding of these files with these options"))
@click.argument("finding_id")
@click.argument("files", nargs=-1, required=True, type=CAPTURE_PATH)
@detector_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: the FINDING object of scan's JSON, with every evidence frame and, when tshark "
                   "is installed, a `tshark` list of one-line summaries per file")
@click.option("--tshark/--no-tshark", "use_tshark", default=True, show_default=True,
              help="summarise the evidence frames with tshark when it is installed")
def show(finding_id, files, detector_list, config_path, sets, fmt, use_tshark) -> int:
    from detectors.scan_command import show as show_finding  # lazy: the detectors load Polars and Numba
    from detectors.scan_config import scan_config  # lazy: as above

    cfg = scan_config(config_path, sets, detector_list, None)
    return show_finding(finding_id, files, cfg, fmt=fmt, use_tshark=use_tshark)


REPORT_EXIT_CODES = """\b
Exit codes:
  0  the report was written (whatever it found: a report is no gate; scan --fail-on is)
  2  usage error (bad option, missing argument, an --out that cannot be written)
  3  unreadable input (missing, a directory, not a pcap/pcapng, no packet readable): nothing is written
  4  internal error (a bug: please report it with the traceback)
  130  interrupted"""


@cli.command(help="Write one self-contained HTML report of a capture: the capture summary, the incidents, every "
                  "finding (worst first) with its explanation, numbers, proof charts and Wireshark commands, the "
                  "findings timeline and the service response times. Charts are inline SVG, the CSS is inline, "
                  "nothing is fetched: the file travels (a CI artifact, a ticket attachment). Several files are "
                  "one capture, as in scan; the detector and selection options are scan's.\n\n"
                  + REPORT_EXIT_CODES)
@click.argument("files", nargs=-1, required=True, type=CAPTURE_PATH)
@detector_options
@selection_options
@click.option("--out", "out", required=True, type=click.Path(), help="the HTML file to write")
@click.option("--title", help="the report's title (default: herdscope report: the file names)")
@click.option("--max-charts", "max_charts", type=click.IntRange(min=0), default=30, show_default=True,
              help="draw proof charts for the worst N findings only (each is tens to hundreds of kB of SVG); "
                   "the others are listed without them")
def report(files, detector_list, config_path, sets, start, end, hosts, ports, out, title, max_charts) -> int:
    from dashboards.report_command import report as write_report  # lazy: loads Polars, Numba, Altair, vl-convert
    from dashboards.report_html import ReportLimits  # lazy: as above
    from detectors.scan_config import scan_config  # lazy: the detectors load Polars and Numba

    cfg = scan_config(config_path, sets, detector_list, None)
    selection = parse_selection(start, end, hosts, ports)
    check_output_file("--out", out)
    return write_report(files, cfg, selection, out=out, title=title, limits=ReportLimits(max_charts=max_charts))


@cli.command("detectors", help="List every detector: what it finds, its finding kinds, the frames it needs "
                               "from the capture, and every parameter with its default, unit, range and "
                               "meaning (what --set and the [DETECTOR] tables of --config accept).\n\n"
                               + exit_codes_help(reads=False, usage=", an unknown detector"))
@click.argument("names", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: one document {detectors: [{name, summary, kinds, requires, parameters}]}")
def detectors_command(names: tuple[str, ...], fmt: str) -> int:
    from detectors.scan_command import list_detectors  # lazy: the detectors load Polars and Numba

    return list_detectors(names, fmt)


@cli.command(help="Open the Streamlit dashboard on localhost with these captures loaded (or the bundled "
                  "samples and an upload box without any).")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--port", default=8501, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--root", "browse_root", type=click.Path(file_okay=False), default=None,
              help="directory the path field may read captures from (default: the current directory)")
@click.option("--max-upload-mb", default=200, show_default=True, type=int)
def dashboard(files, port, address, browse_root, max_upload_mb) -> int:
    from dashboards.launch import launch  # lazy: only this command needs the dashboard's launcher

    return launch(list(files), port=port, address=address, browse_root=browse_root,
                  max_upload_mb=max_upload_mb)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting when called from Python. Called without
    ``argv`` (a process of its own) it ends the process once the command is done, without the
    interpreter's teardown (``analyzer/process_exit.py``)."""
    code = _run(argv)
    if argv is None:
        from .process_exit import leave  # lazy: only a process of its own ends this way

        return leave(code)
    return code


def _run(argv: list[str] | None) -> int:
    """The command's exit code (:func:`main`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None:  # a process of its own (not a caller's): give freed arrays back (analyzer/memory.py)
        from .memory import configure_polars_allocator, return_freed_memory_promptly  # lazy: ctypes.util, ~19 ms

        return_freed_memory_promptly()
        configure_polars_allocator()
        signal.signal(signal.SIGTERM, _terminated)
    try:
        from .progress import stages  # lazy: light, but imports rich on a terminal (not for --help)

        with stages():  # the stage under way on stderr, when it is a terminal
            result = cli.main(args=args, prog_name="herdscope", standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at exit
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code)
    except click.UsageError as exc:
        exc.show()
        return ExitCode.USAGE
    except (click.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        fail("interrupted")
        return ExitCode.INTERRUPTED
    except Terminated:
        fail("terminated")
        return ExitCode.TERMINATED
    except OutputError as exc:
        fail(str(exc))
        return ExitCode.USAGE
    except ClusterFailure as exc:
        fail(str(exc))
        return ExitCode.INTERNAL
    except HerdscopeError as exc:
        fail(str(exc))
        return ExitCode.UNREADABLE
    except (_StdoutClosed, BrokenPipeError):  # `herdscope info *.pcap | head -1`
        _quiet_stdout()
        return ExitCode.BROKEN_PIPE
    except BaseException as exc:  # noqa: BLE001 - the last line of defence: say it is a bug, keep the traceback
        # a panic in Polars' Rust code is pyo3's PanicException, a BaseException: uncaught, Python would
        # exit 1, which says "findings"
        if isinstance(exc, Exception) or type(exc).__name__ == _RUST_PANIC:
            return _internal_error()
        raise
    return int(result or ExitCode.OK)


_RUST_PANIC = "PanicException"  # pyo3's exception for a panic in Rust (polars.exceptions.PanicException)


def _terminated(signum, frame) -> None:
    """SIGTERM's handler in a process of its own: unwind as an exception does (errors.Terminated)."""
    raise Terminated()


def _internal_error() -> int:
    traceback.print_exc()
    fail("internal error (a bug); the traceback above helps us fix it")
    return ExitCode.INTERNAL


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush of what is still
    buffered does not fail again on the closed pipe (the handling Python's signal docs recommend)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (in-process callers): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
