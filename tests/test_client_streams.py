"""The client-identity rule's overlap test (detectors/client_streams.py) against its definition as
Polars expressions, on random requests with missing times and ports."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from detectors.base import client_identity, client_identity_by
from detectors.client_streams import split_rows


def _defined(requests: pl.DataFrame, by: list[str], timeout_ns: int) -> pl.Series:
    """The rule as it reads (the module doc): per group, in order of sending (missing times first),
    a request sent before the latest end of the requests before it (none when the one just before
    has no end), from another port than the one just before it, splits its address."""
    group = requests.select(pl.struct([pl.col(c) for c in by] + [pl.col("client").cast(pl.String)]).hash()
                            .alias("g"))["g"]
    narrow = pl.DataFrame({"g": group}).with_columns(
        requests["request_ts_ns"].alias("s"), requests["client_port"].alias("p"),
        pl.coalesce(requests["response_ts_ns"], requests["request_ts_ns"] + timeout_ns).alias("e")) \
        .sort("g", "s", maintain_order=True)
    same = pl.col("g") == pl.col("g").shift(1)
    split = narrow.filter(
        (same & (pl.col("s") < pl.col("e").cum_max().over("g").shift(1)) & (pl.col("p") != pl.col("p").shift(1)))
        .fill_null(False))["g"].unique()
    return group.is_in(split.implode())


def _requests(rng: np.random.Generator, n: int, nulls: float) -> pl.DataFrame:
    def maybe(values):
        return [None if rng.random() < nulls else int(v) for v in values]

    start = rng.integers(0, 5_000, n)
    return pl.DataFrame({
        "server": rng.choice(["s1", "s2"], n),
        "client": rng.choice(["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"], n),
        "client_port": pl.Series(maybe(rng.integers(1000, 1004, n)), dtype=pl.UInt16),
        "request_ts_ns": pl.Series(maybe(start), dtype=pl.Int64),
        "response_ts_ns": pl.Series(maybe(start + rng.integers(0, 300, n)), dtype=pl.Int64),
    })


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_is_the_rule(seed):
    rng = np.random.default_rng(seed)
    requests = _requests(rng, int(rng.integers(1, 60)), nulls=[0.0, 0.1, 0.4][seed % 3])
    for by in ([], ["server"]):
        for timeout_ns in (50, 1_000):
            got = split_rows(requests, by, "client", "client_port", "request_ts_ns", "response_ts_ns", timeout_ns)
            want = _defined(requests, by, timeout_ns)
            assert (got if got is not None else pl.Series([False] * requests.height)).to_list() == want.to_list()


def test_sequential_ports_are_one_client_and_overlapping_ones_are_streams():
    ms = 1_000_000
    sequential = pl.DataFrame({"client": ["a"] * 3, "client_port": pl.Series([1, 2, 3], dtype=pl.UInt16),
                               "request_ts_ns": [0, 10 * ms, 20 * ms], "response_ts_ns": [ms, 11 * ms, 21 * ms]})
    assert split_rows(sequential, [], "client", "client_port", "request_ts_ns", "response_ts_ns", 10**9) is None
    assert client_identity(sequential)[1] == "address"
    overlapping = sequential.with_columns(pl.Series("response_ts_ns", [30 * ms, 31 * ms, 32 * ms]))
    marked = client_identity_by(overlapping, [])
    assert marked["client_id"].to_list() == ["a:1", "a:2", "a:3"]
    assert set(marked["client_identity"]) == {"address+port"} and client_identity(overlapping)[1] == "address+port"
    unanswered = sequential.with_columns(pl.lit(None, pl.Int64).alias("response_ts_ns"))  # outstanding a timeout
    assert split_rows(unanswered, [], "client", "client_port", "request_ts_ns", "response_ts_ns", 15 * ms) is not None
    assert split_rows(unanswered, [], "client", "client_port", "request_ts_ns", "response_ts_ns", 5 * ms) is None
