"""Zeek's logs as reference output: the baselines under tests/data/corpus/zeek-baselines (Zeek's own
test suite's expected logs for the corpus captures), read for the conformance tests."""
from __future__ import annotations

from pathlib import Path

import polars as pl


def zeek_log(path: Path) -> pl.DataFrame:
    """A Zeek TSV log as strings: ``#fields`` header, or (``zeek-cut -m`` baselines) a plain first
    line of names. ``-`` (unset) becomes null."""
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("###")]
    header = [line.split("\t")[1:] for line in lines if line.startswith("#fields")]
    if header:
        fields = header[0]
        rows = [line.split("\t") for line in lines if not line.startswith("#")]
    else:
        fields = lines[0].split("\t")
        rows = [line.split("\t") for line in lines[1:] if not line.startswith("#")]
    return pl.DataFrame(rows, schema=fields, orient="row").with_columns(pl.all().replace("-", None))
