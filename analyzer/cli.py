"""The ``herdscope`` command.

``main(argv)`` returns an :class:`ExitCode` so tests call it in-process (pytest's own pattern).
"""
from __future__ import annotations

import enum
import json
import sys
import traceback

import click

from . import __version__
from .errors import HerdscopeError, UnreadableCapture

EXIT_CODES_HELP = """\b
Exit codes:
  0  success (scan: no finding reached --fail-on)
  1  scan: findings at or above --fail-on
  2  usage error (bad option, missing argument)
  3  unreadable input (missing file, not a pcap/pcapng, bad gzip)
  4  internal error (a bug: please report it with the traceback)"""


def _each_capture(files, per_capture) -> int:
    """Open each file and call ``per_capture(path, cap)``; unreadable files are reported, not fatal."""
    from .capture import open_capture

    code = ExitCode.OK
    for path in files:
        try:
            with open_capture(path) as cap:
                per_capture(path, cap)
        except UnreadableCapture as exc:
            _fail(str(exc))
            code = ExitCode.UNREADABLE
    return code


class ExitCode(enum.IntEnum):
    OK = 0  # success
    FINDINGS = 1  # scan found something at or above --fail-on
    USAGE = 2  # bad command line
    UNREADABLE = 3  # an input could not be read as a capture
    INTERNAL = 4  # a bug


def _fail(message: str) -> None:
    click.echo(f"herdscope: {message}", err=True)


@click.group(help=f"Find timing pathologies in packet captures.\n\n{EXIT_CODES_HELP}",
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="herdscope")
def cli() -> None:
    pass


@cli.command(help=f"Summarise captures like capinfos: format, link types, packets, times, "
                  f"protocols, damage.\n\n{EXIT_CODES_HELP}")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: one object per file, one per line (keys documented in analyzer/summary.py)")
def info(files: tuple[str, ...], fmt: str) -> int:
    from .render import print_summary
    from .summary import summarize

    def show(path, cap):
        summary = summarize(cap)
        if fmt == "json":
            click.echo(json.dumps(summary, sort_keys=False))
        else:
            print_summary(summary)

    return _each_capture(files, show)


@cli.command(help=f"Write the frames of a capture as Parquet files, one per frame, plus "
                  f"schema.json (a description of every column) and read_report.json.\n\n{EXIT_CODES_HELP}")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write into (created if missing)")
@click.option("--frames", default="all", show_default=True,
              help="comma-separated frame names to write, or 'all'")
@click.option("--compression", type=click.Choice(["lz4", "zstd", "snappy", "uncompressed"]), default="lz4",
              show_default=True, help="Parquet compression (zstd: smaller, slower to write)")
def export(file: str, out_dir: str, frames: str, compression: str) -> int:
    from .capture import open_capture
    from .export import export_frames

    try:
        with open_capture(file) as cap:
            wanted = None if frames == "all" else [f.strip() for f in frames.split(",") if f.strip()]
            written = export_frames(cap, out_dir, wanted, compression)
    except UnreadableCapture as exc:
        _fail(str(exc))
        return ExitCode.UNREADABLE
    except KeyError as exc:
        _fail(str(exc.args[0]))
        return ExitCode.USAGE
    for name, path, rows in written:
        click.echo(f"{name:<16} {rows:>10,} rows  {path}", err=True)
    return ExitCode.OK


@cli.command(help=f"Service response times per protocol and operation (DNS, Kerberos, LDAP, SMB2): count, "
                  f"errors, min/p50/p90/p99/max latency, with SMB2 STATUS_PENDING waits and oplock/lease "
                  f"break acknowledgments.\n\n{EXIT_CODES_HELP}")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: one object per file: {file, stats: [row...]} (columns in analyzer/stats.py)")
def stats(files: tuple[str, ...], fmt: str) -> int:
    from .stats import render_table, service_response_times

    def show(path, cap):
        table = service_response_times(cap)
        if fmt == "json":
            click.echo(json.dumps({"file": path, "stats": table.to_dicts()}))
        else:
            render_table(table, f"Service response times: {path}")

    return _each_capture(files, show)


SEVERITY_CHOICES = ["informational", "low", "medium", "high", "critical"]


@cli.command(help=f"Run the detectors over captures and report findings.\n\n"
                  f"Several files are analysed as one capture (the pieces of a ring buffer, joined in time "
                  f"order; evidence frame numbers then count across the files as mergecap -a would), or each "
                  f"on its own with --separate. The JSON/NDJSON schema is documented in analyzer/scan.py and "
                  f"the README.\n\n{EXIT_CODES_HELP}")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--detectors", "detector_list", metavar="A,B", help="run only these detectors")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="TOML file: [scan] detectors/fail_on, and [DETECTOR] parameter tables")
@click.option("--set", "sets", multiple=True, metavar="DETECTOR.PARAM=VALUE", help="override a parameter")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "ndjson", "parquet", "junit"]),
              default="table", show_default=True)
@click.option("--output", "output", type=click.Path(dir_okay=False), help="write to this file (stdout otherwise)")
@click.option("--fail-on", "fail_on", type=click.Choice(SEVERITY_CHOICES), default=None,
              help="exit 1 when a finding reaches this severity (default: high)")
@click.option("--separate", is_flag=True, help="analyse each file on its own")
def scan(files, detector_list, config_path, sets, fmt, output, fail_on, separate) -> int:
    import polars as pl

    from detectors import ParameterError, at_least, available, run

    from .capture import open_captures
    from .scan import capture_summary, finding_records, load_config, render, render_table

    try:
        cfg = load_config(config_path, sets, detector_list, fail_on)
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    if cfg.fail_on not in SEVERITY_CHOICES:
        raise click.UsageError(f"fail_on {cfg.fail_on!r}: expected one of {', '.join(SEVERITY_CHOICES)}")
    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet needs --output PATH")
    groups = [[f] for f in files] if separate else [list(files)]
    results, frames = [], []
    code = ExitCode.OK
    for group in groups:
        try:
            cap = open_captures(group)
        except UnreadableCapture as exc:
            _fail(str(exc))
            code = ExitCode.UNREADABLE
            continue
        try:
            findings = run(cap, only=cfg.detectors, overrides=cfg.overrides)
        except ParameterError as exc:
            raise click.UsageError(str(exc)) from exc
        names = cfg.detectors or list(available())
        label = "+".join(group)
        results.append((capture_summary(cap, group, findings, names), finding_records(findings, label)))
        frames.append(findings.with_columns(pl.lit(label).alias("capture")))
        if at_least(findings, cfg.fail_on).height and code == ExitCode.OK:
            code = ExitCode.FINDINGS
        cap.close()
    if fmt == "table":
        if output:
            from .render import console as make_console
            with open(output, "w") as fh:
                render_table(results, cfg.fail_on, make_console(fh))
        else:
            render_table(results, cfg.fail_on)
    elif fmt == "parquet":
        (pl.concat(frames) if frames else pl.DataFrame()).write_parquet(output)
    else:
        text = render(results, frames, fmt, cfg.fail_on)
        if output:
            with open(output, "w") as fh:
                fh.write(text)
        else:
            click.echo(text, nl=False)
    return code


@cli.command(help="Open the Streamlit dashboard on localhost with these captures loaded (or the bundled "
                  "samples and an upload box without any).")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--port", default=8501, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--root", "browse_root", type=click.Path(file_okay=False), default=None,
              help="directory the path field may read captures from (default: the current directory)")
@click.option("--max-upload-mb", default=200, show_default=True, type=int)
def dashboard(files, port, address, browse_root, max_upload_mb) -> int:
    from dashboards.launch import launch

    return launch(list(files), port=port, address=address, browse_root=browse_root,
                  max_upload_mb=max_upload_mb)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting when called from Python."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        result = cli.main(args=args, prog_name="herdscope", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code)
    except click.UsageError as exc:
        exc.show()
        return ExitCode.USAGE
    except click.Abort:
        _fail("aborted")
        return ExitCode.USAGE
    except HerdscopeError as exc:
        _fail(str(exc))
        return ExitCode.UNREADABLE
    except BrokenPipeError:  # `herdscope info big.pcap | head`
        sys.stderr.close()
        return ExitCode.OK
    except Exception:  # noqa: BLE001 - the last line of defence: say it is a bug, keep the traceback
        traceback.print_exc()
        _fail("internal error (a bug); the traceback above helps us fix it")
        return ExitCode.INTERNAL
    return int(result or ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
