"""tshark's view of a capture, as a Polars frame: the reference side of conformance tests.

Tests compare what herdscope reads and decodes with what Wireshark's ``tshark`` reports for the
same file::

    from pathlib import Path
    import pytest
    from tshark_ref import have_tshark, tshark_fields, as_int, epoch_to_ns, corpus_files

    CORPUS = Path(__file__).parent / "data" / "corpus"
    pytestmark = [pytest.mark.tshark,
                  pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]

    def test_timestamps():
        ref = tshark_fields(CORPUS / "tcpdump/tcp-handshake-nano.pcap",
                            ["frame.number", "frame.time_epoch", "tcp.seq_raw", "tcp.len"])
        ref = ref.with_columns(as_int("frame.number"), epoch_to_ns("frame.time_epoch"),
                               as_int("tcp.seq_raw"), as_int("tcp.len"))

(``tests/`` is on ``sys.path`` under pytest's default import mode, so ``import tshark_ref`` works
from any test module.)  ``corpus_files("tcp")`` lists the rows of ``tests/data/corpus/SOURCES.tsv``
whose purposes include ``tcp``; see ``tests/data/corpus/README.md`` for which capture shows what.

What ``tshark_fields`` runs
---------------------------
``tshark -n -r PATH -T fields -E header=y -E separator=/t -E quote=n -E occurrence=O
-E aggregator=A [-2] [-Y FILTER] [-o key:value ...] -e F1 -e F2 ...``

* Every column of the result is ``pl.Utf8``; an empty tshark value becomes null. Convert with
  :func:`as_int`, :func:`as_hex_int`, :func:`as_bool`, :func:`as_flag`, :func:`as_list`,
  :func:`epoch_to_ns`.
* Column names are the field names exactly as given (``"tcp.seq_raw"``); a field may be listed once.
* tshark runs with ``TZ=UTC`` and with ``WIRESHARK_CONFIG_DIR`` pointing at an empty directory, so a
  developer's personal Wireshark preferences cannot change the reference.  Pass preferences
  explicitly with ``prefs={"tcp.relative_sequence_numbers": False}``.
* stderr is kept: :func:`tshark_run` returns a :class:`TsharkResult` (``.frame``, ``.stderr``,
  ``.warnings``, ``.returncode``, ``.command``); :func:`tshark_fields` returns only the frame but
  also sets ``frame.tshark_stderr``, ``frame.tshark_warnings`` and ``frame.tshark_returncode`` on it
  (plain attributes: they do not survive ``with_columns`` and friends, so read them first).
* A run that prints no header line (unknown field, bad display filter, unreadable file with no
  records) raises :class:`TsharkError` carrying tshark's stderr.  A run that prints rows but exits
  non-zero (a capture cut short in the middle of a record exits 2) is *not* an error: the rows are
  returned and ``returncode``/``stderr`` say what happened.

Cache
-----
Results are cached on disk, keyed by a SHA-256 of (resolved path, file size, mtime_ns, tshark binary
and version line, full argument list).  Directory: ``$HERDSCOPE_TSHARK_CACHE`` if set, else
``$XDG_CACHE_HOME/herdscope-tshark``, else ``~/.cache/herdscope-tshark``.  It lives outside the
repository on purpose (nothing to git-ignore, survives ``git clean``, shared by worktrees); it is
safe to delete at any time.  Set ``HERDSCOPE_TSHARK_CACHE=off`` (or ``0``/empty) to disable it, or
pass ``cache=False``.  Entries are written atomically, so parallel test workers are fine.  Failed
runs are never cached.

What tshark 4.0.17 (Debian 12) actually prints - checked on the files in tests/data/corpus
-----------------------------------------------------------------------------------------
Sequence numbers
    ``tcp.seq``/``tcp.ack`` are *relative* by default (the SYN is 0).  ``tcp.seq_raw``/
    ``tcp.ack_raw`` are the absolute 32-bit values from the header.  With the preference
    ``tcp.relative_sequence_numbers:FALSE`` ``tcp.seq``/``tcp.ack`` become absolute too (equal to
    the ``_raw`` fields).  On a segment without the ACK flag ``tcp.ack`` prints ``0``.
``tcp.len``
    The TCP payload length computed from the IP header (``ip.len - ip.hdr_len - tcp.hdr_len``),
    *not* what was captured: in ``zeek/tcp/truncated-header.pcap`` (snaplen 68) frame 4 has
    ``frame.cap_len`` 54 but ``tcp.len`` 84.  ``tcp.hdr_len`` is likewise the header's data offset.
Time
    ``frame.time_epoch``, ``frame.time_relative`` and ``frame.time_delta`` always print nine
    fraction digits ("1418145369.924505488"); for nanosecond pcap/pcapng they are the exact on-disk
    nanoseconds, for microsecond files the last three digits are ``000``.  pcapng ``if_tsresol``
    is honoured, including powers of two: ``gopacket/pcapng-suite/le/test902.pcapng``
    (``if_tsresol=0x88``, 2^-8 s) gives ``1519128000.195312500`` (50/256 s, exact).
    ``frame.time_relative`` is relative to the first record of the file, also under ``-Y``
    (``frame.time_delta_displayed`` is the one that follows the filter).  ``frame.time`` is local
    time, hence ``TZ=UTC`` here.  Records without a timestamp (pcapng Simple Packet Blocks, custom
    blocks) have an *empty* ``frame.time_epoch``.  Invalid sub-second fields are printed literally:
    ``tcpdump/timestamp_invalid_nano.pcap`` gives ``1418145370.1000000000`` (ten digits) and
    ``-1418145370.2147483648`` (nsec 2147483648 read as a negative int32); see :func:`epoch_to_ns`.
Records that are not packets
    tshark numbers pcapng custom blocks (0x00000BAD / 0x40000BAD) as frames too: they show up with
    an empty ``frame.encap_type``, no time and protocol ``data`` (``le/test018.pcapng``: 8 frames
    for 4 packets).  ``frame.number`` therefore counts records, not packets.
    ``frame.interface_id`` is the id *within the record's pcapng section*: ids restart at 0 in
    every section and tshark does not renumber them (``le/test201.pcapng``, 3 sections / 5 IDBs:
    frame 4 sits on the second IDB of section 3 and reports ``1``).  Pair it with the section
    (or with ``frame.encap_type``) before comparing.
Display filter
    ``-Y`` only hides rows: frame numbers keep their original values and TCP/DNS analysis still
    sees every packet.
One pass vs two passes
    ``tcp.analysis.*`` flags came out identical with and without ``-2`` on the TCP captures tried
    (wireshark-retrans, reassembly, tcp-rst-unacked-stream-10).  Fields that point *forward* need
    ``two_pass=True``: ``dns.response_in`` (empty in one pass), ``tcp.reassembled_in`` on the
    earlier segments of a PDU, ``ip.reassembled_in`` on the first fragment.
Field value formats
    Booleans print ``1``/``0`` (tshark >= 4.2 prints ``True``/``False``; :func:`as_bool` accepts
    both).  "Flag" fields without a value (``tcp.analysis.retransmission``,
    ``dns.retransmission``, ``tcp.analysis.zero_window`` ...) print ``1`` when present and
    nothing otherwise - but ``tcp.analysis.duplicate_ack`` is added twice per frame and prints
    ``1,1`` under ``occurrence='a'``, and ``_ws.malformed`` prints its text
    (``[Reassembly error, protocol TCP: ...],_ws.malformed``).  Test presence with
    :func:`as_flag` (non-null), or ask with ``occurrence='f'``.  Hex-displayed integers keep their ``0x`` prefix and
    padding: ``dns.id`` ``0x5934``, ``tcp.flags`` ``0x0012``, ``smb2.nt_status`` ``0x00000103``
    -> :func:`as_hex_int`.  ``smb2.msg_id`` of an unsolicited lease/oplock break prints
    ``18446744073709551615`` (needs ``pl.UInt64``).  Byte fields print bare hex
    (``tcp.options.sack_perm`` -> ``0402``).
Repeated fields
    With ``occurrence='a'`` all occurrences are joined by ``aggregator`` in packet order: QinQ
    ``vlan.id`` is ``"118,10"`` (outer tag first); a compound SMB2 frame gives ``smb2.cmd``
    ``"5,17,6"``; a TCP segment carrying two Kerberos records gives ``kerberos.msg_type``
    ``"10,12"``.  Fields whose text can contain the aggregator (``_ws.col.Info``,
    ``_ws.expert.message``) need another ``aggregator`` (e.g. ``"|"``) or ``occurrence='f'``.
Exit status / stderr
    Capture cut short in the middle of a record: rows for every complete record, exit status 2,
    stderr "The file ... appears to have been cut short in the middle of a packet."  Unknown
    field: exit 1, "Some fields aren't valid".  Bad filter: exit 2.  Dissector problems are
    warnings on stderr with exit 0 (``zeek/ldap/ldap-max-recursion.pcap``: "Dissector bug,
    protocol LDAP ... Maximum tree depth 500 exceeded").  When tshark runs as root every run
    also prints 'Running as user "root" and group "root". This could be dangerous.' -
    :attr:`TsharkResult.warnings` leaves that line out.  Gzip-compressed captures are read
    directly.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence, Union

import polars as pl

__all__ = [
    "TsharkError",
    "TsharkResult",
    "as_bool",
    "as_flag",
    "as_hex_int",
    "as_int",
    "as_list",
    "cache_dir",
    "corpus_files",
    "epoch_to_ns",
    "have_tshark",
    "parse_epoch_ns",
    "tshark_env",
    "tshark_fields",
    "tshark_run",
    "tshark_version",
]

#: Executable to run; override with $HERDSCOPE_TSHARK (e.g. a different Wireshark build).
TSHARK = os.environ.get("HERDSCOPE_TSHARK", "tshark")

_ROOT_BANNER = re.compile(r'^Running as user ".*" and group ".*"\. This could be dangerous\.$')
_CACHE_FORMAT = 1

ColumnLike = Union[str, pl.Expr, pl.Series]


class TsharkError(RuntimeError):
    """tshark produced no usable output (bad field, bad filter, unreadable file...)."""

    def __init__(self, message: str, *, command: Sequence[str], returncode: int, stderr: str):
        super().__init__(f"{message}\n  command: {' '.join(command)}\n  exit status: {returncode}\n"
                         f"  stderr:\n{_indent(stderr)}")
        self.command = tuple(command)
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class TsharkResult:
    """One tshark run: the parsed frame plus everything needed to explain it."""

    frame: pl.DataFrame
    stderr: str
    returncode: int
    command: tuple[str, ...]
    cached: bool = field(default=False, compare=False)

    @property
    def warnings(self) -> list[str]:
        """stderr lines, without blank lines and without the running-as-root banner."""
        return [line for line in self.stderr.splitlines()
                if line.strip() and not _ROOT_BANNER.match(line.strip())]


# --------------------------------------------------------------------------------------------
# tshark itself
# --------------------------------------------------------------------------------------------

def _tshark_exe() -> str | None:
    return shutil.which(TSHARK)


def have_tshark() -> bool:
    """True when the tshark executable is on PATH and answers ``--version``."""
    return bool(_version_line())


@functools.lru_cache(maxsize=None)
def _version_line() -> str:
    exe = _tshark_exe()
    if exe is None:
        return ""
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60,
                              env=tshark_env())
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in proc.stdout.splitlines():
        if line.startswith("TShark"):
            return line.strip()
    return ""


def tshark_version() -> tuple[int, ...]:
    """Version of the installed tshark, e.g. ``(4, 0, 17)``; ``()`` when tshark is missing."""
    m = re.search(r"TShark \(Wireshark\) (\d+(?:\.\d+)*)", _version_line())
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


@functools.lru_cache(maxsize=None)
def _empty_config_dir() -> str:
    # A private, empty personal-configuration directory so ~/.config/wireshark cannot leak in;
    # removed again when the interpreter exits.
    path = tempfile.mkdtemp(prefix="herdscope-wireshark-config-")
    atexit.register(shutil.rmtree, path, True)
    return path


def tshark_env() -> dict[str, str]:
    """The environment tshark runs in: UTC, a C locale and an empty configuration directory (so that
    no user profile changes its output)."""
    env = dict(os.environ)
    env["TZ"] = "UTC"
    env["LC_ALL"] = "C.UTF-8"
    env["WIRESHARK_CONFIG_DIR"] = _empty_config_dir()
    return env


# --------------------------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------------------------

def cache_dir() -> Path | None:
    """Where results are cached, or None when caching is switched off."""
    env = os.environ.get("HERDSCOPE_TSHARK_CACHE")
    if env is not None:
        if env.strip().lower() in ("", "0", "off", "no", "false", "none"):
            return None
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "herdscope-tshark"


def _cache_key(path: Path, args: Sequence[str]) -> str:
    st = path.stat()
    blob = json.dumps({
        "format": _CACHE_FORMAT,
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "tshark": _tshark_exe(),
        "version": _version_line(),
        "args": list(args),
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _cache_load(directory: Path, key: str) -> tuple[str, str, int] | None:
    meta, out = directory / f"{key}.json", directory / f"{key}.out"
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
        stdout = out.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    if info.get("format") != _CACHE_FORMAT:
        return None
    return stdout, info["stderr"], int(info["returncode"])


def _atomic_write(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _cache_store(directory: Path, key: str, stdout: str, stderr: str, returncode: int,
                 command: Sequence[str]) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # stdout first, metadata last: a reader only trusts an entry whose .json exists.
        _atomic_write(directory / f"{key}.out", stdout)
        _atomic_write(directory / f"{key}.json", json.dumps({
            "format": _CACHE_FORMAT, "returncode": returncode, "stderr": stderr,
            "command": list(command), "version": _version_line()}))
    except OSError:
        pass  # an unwritable cache must never fail a test


# --------------------------------------------------------------------------------------------
# running and parsing
# --------------------------------------------------------------------------------------------

def _pref_value(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return str(value)


def _build_args(fields: Sequence[str], display_filter: str | None, two_pass: bool,
                prefs: Mapping[str, object] | None, occurrence: str | int,
                aggregator: str, extra_args: Sequence[str]) -> list[str]:
    if isinstance(fields, str):
        raise TypeError("fields must be a list of field names, not a single string")
    fields = list(fields)
    if not fields:
        raise ValueError("at least one field is needed")
    dupes = sorted({f for f in fields if fields.count(f) > 1})
    if dupes:
        raise ValueError(f"fields listed more than once: {dupes}")
    for f in fields:
        if not f or any(c.isspace() for c in f):
            raise ValueError(f"not a field name: {f!r}")
    occ = str(occurrence)
    if occ not in ("a", "f", "l") and not re.fullmatch(r"-?\d+", occ):
        raise ValueError("occurrence must be 'a', 'f', 'l' or an integer")
    if not aggregator or "\t" in aggregator or "\n" in aggregator:
        raise ValueError("aggregator must be non-empty and contain no tab or newline")
    args = ["-n", "-T", "fields", "-E", "header=y", "-E", "separator=/t", "-E", "quote=n",
            "-E", f"occurrence={occ}", "-E", f"aggregator={aggregator}"]
    if two_pass:
        args.append("-2")
    if display_filter:
        args += ["-Y", display_filter]
    for key, value in (prefs or {}).items():
        args += ["-o", f"{key}:{_pref_value(value)}"]
    args += list(extra_args)
    for f in fields:
        args += ["-e", f]
    return args


def _parse(stdout: str, fields: Sequence[str], command: Sequence[str], returncode: int,
           stderr: str) -> pl.DataFrame:
    lines = stdout.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header = lines[0].rstrip("\r").split("\t") if lines else []
    if header != list(fields):
        raise TsharkError("tshark printed no header line for the requested fields"
                          if not lines else f"unexpected header line {lines[0]!r}",
                          command=command, returncode=returncode, stderr=stderr)
    columns: list[list[str | None]] = [[] for _ in fields]
    width = len(fields)
    for number, line in enumerate(lines[1:], start=2):
        values = line.rstrip("\r").split("\t")
        if len(values) != width:
            raise TsharkError(f"output line {number} has {len(values)} columns, expected "
                              f"{width}: {line[:200]!r}", command=command,
                              returncode=returncode, stderr=stderr)
        for column, value in zip(columns, values):
            column.append(value if value != "" else None)
    return pl.DataFrame({f: pl.Series(f, col, dtype=pl.Utf8) for f, col in zip(fields, columns)})


def tshark_run(path: Union[str, os.PathLike], fields: Sequence[str], *,
               display_filter: str | None = None, two_pass: bool = False,
               prefs: Mapping[str, object] | None = None, occurrence: str | int = "a",
               aggregator: str = ",", extra_args: Sequence[str] = (), cache: bool = True,
               timeout: float = 600) -> TsharkResult:
    """Run tshark on ``path`` and return the frame together with stderr and exit status.

    Arguments are those of :func:`tshark_fields`; ``extra_args`` are appended before the ``-e``
    options (e.g. ``["-d", "tcp.port==4445,nbss"]``, a decode-as rule).
    """
    exe = _tshark_exe()
    if exe is None or not have_tshark():
        raise TsharkError("tshark is not installed", command=[TSHARK], returncode=-1, stderr="")
    p = Path(path).resolve()
    if not p.is_file():
        raise FileNotFoundError(p)
    args = _build_args(fields, display_filter, two_pass, prefs, occurrence, aggregator,
                       extra_args)
    command = (exe, "-r", str(p), *args)
    directory = cache_dir() if cache else None
    key = _cache_key(p, args) if directory is not None else ""
    hit = _cache_load(directory, key) if directory is not None else None
    if hit is not None:
        stdout, stderr, returncode = hit
        return TsharkResult(_parse(stdout, fields, command, returncode, stderr), stderr,
                            returncode, command, cached=True)
    proc = subprocess.run(command, capture_output=True, timeout=timeout, env=tshark_env())
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace")
    frame = _parse(stdout, fields, command, proc.returncode, stderr)  # raises before caching
    if directory is not None:
        _cache_store(directory, key, stdout, stderr, proc.returncode, command)
    return TsharkResult(frame, stderr, proc.returncode, command)


def tshark_raw(path: Union[str, os.PathLike], args: Sequence[str], *, cache: bool = True,
               timeout: float = 600) -> tuple[str, str, int]:
    """``tshark -r PATH ARGS...`` with the same environment and cache as :func:`tshark_run`, for
    outputs other than ``-T fields`` (``-T json``, ``-z`` statistics). Returns (stdout, stderr, rc)."""
    exe = _tshark_exe()
    if exe is None or not have_tshark():
        raise TsharkError("tshark is not installed", command=[TSHARK], returncode=-1, stderr="")
    p = Path(path).resolve()
    args = list(args)
    directory = cache_dir() if cache else None
    key = _cache_key(p, args) if directory is not None else ""
    hit = _cache_load(directory, key) if directory is not None else None
    if hit is not None:
        return hit
    command = (exe, "-r", str(p), *args)
    proc = subprocess.run(command, capture_output=True, timeout=timeout, env=tshark_env())
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace")
    if directory is not None and proc.returncode == 0:
        _cache_store(directory, key, stdout, stderr, proc.returncode, command)
    return stdout, stderr, proc.returncode


def tshark_fields(path: Union[str, os.PathLike], fields: Sequence[str], *,
                  display_filter: str | None = None, two_pass: bool = False,
                  prefs: Mapping[str, object] | None = None, occurrence: str | int = "a",
                  aggregator: str = ",", extra_args: Sequence[str] = (),
                  cache: bool = True) -> pl.DataFrame:
    """tshark's values of ``fields`` for every record of ``path`` (one row per displayed record).

    Parameters
    ----------
    fields:
        tshark field names (``tshark -G fields``), e.g. ``["frame.number", "tcp.seq_raw"]``.
    display_filter:
        ``-Y`` filter; rows are hidden, numbering and analysis are unchanged.
    two_pass:
        add ``-2`` (needed for forward references such as ``dns.response_in``).
    prefs:
        ``{"tcp.relative_sequence_numbers": False}`` -> ``-o tcp.relative_sequence_numbers:FALSE``.
    occurrence, aggregator:
        ``-E occurrence=`` (``'a'`` all, ``'f'`` first, ``'l'`` last, or an index) and
        ``-E aggregator=`` for fields that occur several times in one record.

    Returns a frame of ``pl.Utf8`` columns named after the fields (empty -> null).  The run's
    stderr, warnings and exit status are attached as ``tshark_stderr``, ``tshark_warnings`` and
    ``tshark_returncode`` attributes; use :func:`tshark_run` to get them in a proper object.
    """
    result = tshark_run(path, fields, display_filter=display_filter, two_pass=two_pass,
                        prefs=prefs, occurrence=occurrence, aggregator=aggregator,
                        extra_args=extra_args, cache=cache)
    frame = result.frame
    try:
        frame.tshark_stderr = result.stderr  # type: ignore[attr-defined]
        frame.tshark_warnings = result.warnings  # type: ignore[attr-defined]
        frame.tshark_returncode = result.returncode  # type: ignore[attr-defined]
    except AttributeError:  # a Polars version with __slots__ on DataFrame: use tshark_run()
        pass
    return frame


# --------------------------------------------------------------------------------------------
# typed helpers
# --------------------------------------------------------------------------------------------

def _apply(col: ColumnLike, fn) -> Union[pl.Expr, pl.Series]:
    """Apply an expression-building ``fn`` to a column name, an expression or a Series."""
    if isinstance(col, str):
        return fn(pl.col(col)).alias(col)
    if isinstance(col, pl.Series):
        return pl.select(fn(pl.lit(col)).alias(col.name)).to_series()
    if isinstance(col, pl.Expr):
        return fn(col)
    raise TypeError(f"expected a column name, pl.Expr or pl.Series, got {type(col).__name__}")


def as_int(col: ColumnLike, dtype: pl.DataType = pl.Int64) -> Union[pl.Expr, pl.Series]:
    """Decimal text -> integers (strict: ``"1,2"`` or ``"0x10"`` raise; null stays null).

    Give ``col`` as a column name (-> expression aliased to the same name, for ``with_columns``),
    an expression or a Series (-> Series).  Use ``dtype=pl.UInt64`` for 64-bit unsigned fields.
    """
    return _apply(col, lambda e: e.cast(dtype, strict=True))


def as_hex_int(col: ColumnLike, dtype: pl.DataType = pl.Int64) -> Union[pl.Expr, pl.Series]:
    """``"0x00000103"`` -> 259.  The ``0x`` prefix is optional; anything else non-hex raises."""
    def fn(e: pl.Expr) -> pl.Expr:
        digits = e.str.strip_chars().str.replace(r"^0[xX]", "")
        try:
            return digits.str.to_integer(base=16, dtype=dtype, strict=True)
        except TypeError:  # Polars without the dtype argument
            return digits.str.to_integer(base=16, strict=True).cast(dtype, strict=True)
    return _apply(col, fn)


def as_bool(col: ColumnLike) -> Union[pl.Expr, pl.Series]:
    """``1``/``0`` (tshark 4.0) or ``True``/``False`` (tshark >= 4.2) -> Boolean.

    For flag fields (``tcp.analysis.retransmission``: ``1`` or nothing, sometimes ``1,1``) use
    :func:`as_flag` instead.
    """
    mapping = {"1": True, "0": False, "True": True, "False": False,
               "TRUE": True, "FALSE": False, "true": True, "false": False}
    return _apply(col, lambda e: e.replace_strict(mapping, return_dtype=pl.Boolean))


def as_flag(col: ColumnLike) -> Union[pl.Expr, pl.Series]:
    """True where tshark printed anything for a flag field (``tcp.analysis.*``, ``_ws.malformed``),
    False where it printed nothing.  Robust to ``"1,1"`` (``tcp.analysis.duplicate_ack``)."""
    return _apply(col, lambda e: e.is_not_null())


def as_list(col: ColumnLike, aggregator: str = ",") -> Union[pl.Expr, pl.Series]:
    """Split an aggregated multi-occurrence value (``"118,10"``) into ``List[Utf8]``."""
    return _apply(col, lambda e: e.str.split(aggregator))


_EPOCH_RE = re.compile(r"^(-?)(\d+)(?:\.(\d*))?$")


def parse_epoch_ns(text: str) -> int:
    """Exact integer nanoseconds from tshark's ``frame.time_epoch`` text (pure Python).

    ``"1418145369.924505488"`` -> 1418145369924505488.  Fewer than nine fraction digits are
    right-padded (``"1.5"`` -> 1_500_000_000).  tshark prints the nanosecond field with
    ``%09d``, so more than nine digits can only come from an invalid on-disk sub-second field
    (``"1418145370.1000000000"``): those digits are taken as a nanosecond count, which reproduces
    ``seconds * 1e9 + nanoseconds`` as stored.  A leading ``-`` negates the whole value (right for
    genuinely negative times; tshark 4.0 also prints ``-S.N`` when only the nanosecond part is
    negative, which cannot be told apart from the text).
    """
    m = _EPOCH_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an epoch time: {text!r}")
    sign, secs, frac = m.group(1), int(m.group(2)), m.group(3) or ""
    frac_ns = int(frac) if len(frac) >= 9 else int(frac.ljust(9, "0"))
    total = secs * 1_000_000_000 + frac_ns
    return -total if sign else total


def epoch_to_ns(col: ColumnLike) -> Union[pl.Expr, pl.Series]:
    """``frame.time_epoch`` text -> Int64 nanoseconds since 1970, exactly (no float involved).

    Same rules as :func:`parse_epoch_ns`; done with string operations inside Polars.  Null stays
    null (pcapng Simple Packet Blocks and custom-block records have no time); text that is not
    ``[-]digits[.digits]`` raises.
    """
    def fn(e: pl.Expr) -> pl.Expr:
        text = e.str.strip_chars()
        negative = text.str.starts_with("-")
        body = text.str.replace(r"^-", "")
        # On a well-formed value these keep only the wanted group; anything else is left as is
        # and then fails the strict integer cast, so malformed input cannot turn into null.
        secs = body.str.replace(r"^(\d+)(?:\.\d*)?$", "${1}").cast(pl.Int64, strict=True)
        frac = body.str.replace(r"^\d+(?:\.(\d*))?$", "${1}")
        frac_ns = (pl.when(frac.str.len_chars() >= 9).then(frac)
                   .otherwise(frac.str.pad_end(9, "0"))).cast(pl.Int64, strict=True)
        total = secs * 1_000_000_000 + frac_ns
        return pl.when(negative).then(-total).otherwise(total)
    return _apply(col, fn)


# --------------------------------------------------------------------------------------------

def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) or "    (empty)"


def corpus_files(purpose: str | None = None, sources: Union[str, os.PathLike, None] = None
                 ) -> list[dict[str, str]]:
    """Rows of ``tests/data/corpus/SOURCES.tsv``, optionally only those with ``purpose``."""
    tsv = Path(sources) if sources else Path(__file__).parent / "data" / "corpus" / "SOURCES.tsv"
    rows: list[dict[str, str]] = []
    with open(tsv, encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        for line in fh:
            values = line.rstrip("\n").split("\t")
            row = dict(zip(header, values))
            if purpose is None or purpose in row.get("purposes", "").split(","):
                rows.append(row)
    return rows
