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
    from .capture import open_capture
    from .render import print_summary
    from .summary import summarize

    code = ExitCode.OK
    for path in files:
        try:
            with open_capture(path) as cap:
                summary = summarize(cap)
        except UnreadableCapture as exc:
            _fail(str(exc))
            code = ExitCode.UNREADABLE
            continue
        if fmt == "json":
            click.echo(json.dumps(summary, sort_keys=False))
        else:
            print_summary(summary)
    return code


@cli.command(help=f"Write the frames of a capture as Parquet files, one per frame, plus "
                  f"schema.json (a description of every column) and read_report.json.\n\n{EXIT_CODES_HELP}")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write into (created if missing)")
@click.option("--frames", default="all", show_default=True,
              help="comma-separated frame names to write, or 'all'")
def export(file: str, out_dir: str, frames: str) -> int:
    from .capture import open_capture
    from .export import export_frames

    try:
        with open_capture(file) as cap:
            wanted = None if frames == "all" else [f.strip() for f in frames.split(",") if f.strip()]
            written = export_frames(cap, out_dir, wanted)
    except UnreadableCapture as exc:
        _fail(str(exc))
        return ExitCode.UNREADABLE
    except KeyError as exc:
        _fail(str(exc.args[0]))
        return ExitCode.USAGE
    for name, path, rows in written:
        click.echo(f"{name:<16} {rows:>10,} rows  {path}", err=True)
    return ExitCode.OK


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
