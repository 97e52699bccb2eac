"""replication_conflict (detectors/replication_conflict.py) on constructed ldap_sync rows, and on the
real two-provider recordings (samples/ldap-repl-conflict*.pcap, samples/eval/ldap-repl-*)."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer.decoders.ldap_sync import SYNC_COLUMNS
from analyzer.schema import polars_type
from detectors import replication_conflict as rc
from fakes import FakeCapture

P1, P2, A, B = "10.77.0.91", "10.77.0.92", "10.77.3.1", "10.77.3.2"
DN = "cn=shared,dc=example"
UUID = "fe0ba5ec-81fa-1041-9701-032a861b0b4e"
MS = 1_000_000
T0 = 1_796_000_000 * 1_000_000_000
SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def csn(t_ns: int, sid: int) -> str:
    import datetime as dt

    d = dt.datetime.fromtimestamp(t_ns // 1_000_000_000, dt.timezone.utc)
    return f"{d:%Y%m%d%H%M%S}.{(t_ns % 1_000_000_000) // 1000:06d}Z#000000#{sid:03x}#000000"


class Wire:
    """ldap_sync rows and ldap_transactions rows of a small two-provider story."""

    def __init__(self):
        self.rows: list[dict] = []
        self.tx: list[dict] = []
        self.frame = 0

    def _row(self, **kw) -> dict:
        self.frame += 1
        r = {c.name: None for c in SYNC_COLUMNS}
        r.update(frame=self.frame, transport="tcp", flow=1, sport=389, dport=40000, message_id=1, **kw)
        self.rows.append(r)
        return r

    def write(self, t_ms: float, client: str, server: str, value: str, attr: str = "description",
              resp_ms: float = 1.0, result: int = 0):
        r = self._row(ts_ns=T0 + int(t_ms * MS), kind="modify", server=server, client=client, src=client, dst=server,
                      dn=DN, attributes=[attr], ops=["replace"], value_counts=[1], value_digests=[hash(value) & 2**63 - 1],
                      values=[value])
        self.tx.append(dict(request_frame=r["frame"], response_ts_ns=r["ts_ns"] + int(resp_ms * MS),
                            response_frame=r["frame"] + 1000, result_code=result, client=client, client_port=40000))
        return r

    def version(self, t_ms: float, provider: str, consumer: str, csn_ms: float, sid: int, values: dict,
                kind: str = "sync_state"):
        c = csn(T0 + int(csn_ms * MS), sid)
        names = [*values, "entryCSN"]
        vals = [*values.values(), c]
        return self._row(ts_ns=T0 + int(t_ms * MS), kind=kind, server=provider, client=consumer, src=provider,
                         dst=consumer, dn=DN, entry_uuid=UUID if kind == "sync_state" else None,
                         state="modify" if kind == "sync_state" else None, entry_csn=c,
                         csn_ts_ns=T0 + int(csn_ms * MS), csn_count=0, csn_sid=sid, csn_mod=0,
                         cookie_sid=sid if kind == "sync_state" else None,
                         attributes=names, value_counts=[1] * len(names),
                         value_digests=[hash(v) & 2**63 - 1 for v in vals], values=vals)

    def capture(self) -> FakeCapture:
        sync = pl.DataFrame(self.rows, schema={c.name: polars_type(c) for c in SYNC_COLUMNS})
        tx = pl.DataFrame(self.tx, schema={"request_frame": pl.UInt32, "response_ts_ns": pl.Int64,
                                           "response_frame": pl.UInt32, "result_code": pl.Int32,
                                           "client": pl.String, "client_port": pl.UInt16})
        return FakeCapture(resolution_ns=1000.0, ldap_sync=sync, ldap_transactions=tx)


def conflict_story(gap_ms: float = 0.2, value_b: str = "B", attr_b: str = "description", twin: bool = False):
    """A writes on P1 at 0, B on P2 (or P1 for the twin) ``gap_ms`` later; each provider pushes its version."""
    w = Wire()
    w.write(0.0, A, P1, "A")
    sb = P1 if twin else P2
    w.write(gap_ms, B, sb, value_b, attr=attr_b)
    va = {"description": "A", "l": "base"}
    vb = {"description": value_b if attr_b == "description" else "base", "l": value_b if attr_b == "l" else "base"}
    if twin:
        w.version(1.5, P1, P2, 0.5, 1, va)
        w.version(gap_ms + 1.5, P1, P2, gap_ms + 0.5, 1, vb)
    else:
        w.version(3.0, P1, P2, 0.5, 1, va)  # A's version reaches P2 at 3 ms
        w.version(gap_ms + 3.2, P2, P1, gap_ms + 0.5, 2, vb)
    return w


def run(cap, **overrides):
    return rc.detect(cap, rc.Params(**overrides))


def test_concurrent_writes_on_two_providers_are_a_lost_update():
    f = run(conflict_story().capture())
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "lost_update" and r["severity"] == "medium"
    assert r["client"] == A and r["server"] == P1 and r["resource"] == DN  # A's value was the one lost
    assert "'A' is lost" in r["explanation"] and "serverID 2" in r["explanation"]
    assert r["metric"] == "csn_gap_ms" and abs(r["value"] - 0.2) < 1e-6
    assert abs(r["threshold"] - 2.5) < 1e-6  # A's CSN (0.5 ms) to its arrival at P2 (3 ms)


def test_a_write_after_the_other_version_arrived_is_not_a_conflict():
    assert run(conflict_story(gap_ms=60.0).capture()).height == 0  # the near miss: 60 ms > the 3 ms delay


def test_same_value_and_serialised_twin_are_silent():
    assert run(conflict_story(value_b="A").capture()).height == 0
    assert run(conflict_story(twin=True).capture()).height == 0


def test_different_attributes_lost_only_when_the_winner_dropped_the_other():
    # the winner (B's version) carries description=base: A's description write was reverted -> lost
    f = run(conflict_story(value_b="Bl", attr_b="l").capture())
    assert f.height == 1 and "description" in f["explanation"][0]
    # a server that merged both (B's version carries A's description too): nothing lost
    w = Wire()
    w.write(0.0, A, P1, "A")
    w.write(0.2, B, P2, "Bl", attr="l")
    w.version(3.0, P1, P2, 0.5, 1, {"description": "A", "l": "base"})
    w.version(3.4, P2, P1, 0.7, 2, {"description": "A", "l": "Bl"})
    assert run(w.capture()).height == 0


def test_a_version_replicated_twice_is_one_version():
    w = conflict_story()
    w.version(4.0, P1, "10.77.0.93", 0.5, 1, {"description": "A", "l": "base"})  # A's version to a third server
    f = run(w.capture())
    assert f.height == 1


def test_divergence_when_a_provider_goes_back_to_the_older_version():
    w = conflict_story()
    w.version(900.0, P2, "10.77.3.10", 0.5, 1, {"description": "A", "l": "base"}, kind="entry")  # P2 serves A's again
    f = run(w.capture())
    assert f["kind"].to_list() == ["divergence"] and f["severity"][0] == "high"
    assert "diverged" in f["explanation"][0]
    assert f["server"][0] == f"{P1}, {P2}" and f["client"][0] is None  # both providers, no one client
    assert run(w.capture(), divergence_severity="medium")["severity"][0] == "medium"


def test_divergence_when_two_providers_serve_one_csn_with_different_values():
    w = conflict_story(value_b="Bl", attr_b="l")
    vb = w.rows[-1]
    # P1 merged (A's description and B's l under B's CSN), P2 did not: same CSN, other values
    w.version(900.0, P1, "10.77.3.10", 0.7, 2, {"description": "A", "l": "Bl"}, kind="entry")
    w.version(901.0, P2, "10.77.3.10", 0.7, 2, {"description": "base", "l": "Bl"}, kind="entry")
    f = run(w.capture())
    assert f["kind"].to_list() == ["divergence"]
    assert "newer CSN with other values" in f["explanation"][0] and vb["entry_csn"] in f["explanation"][0]


def test_repeats_on_one_entry_raise_the_severity():
    w = Wire()
    for k in range(3):
        t = 100.0 * k
        w.write(t, A, P1, f"A{k}")
        w.write(t + 0.2, B, P2, f"B{k}")
        w.version(t + 3.0, P1, P2, t + 0.5, 1, {"description": f"A{k}"})
        w.version(t + 3.2, P2, P1, t + 0.7, 2, {"description": f"B{k}"})
    f = run(w.capture())
    # pairs: (A0,B0), (B0,A1) sequential, (A1,B1), ...: three lost updates of A's values
    assert f.height == 3 and set(f["severity"].cast(pl.String)) == {"high"}
    assert set(run(w.capture(), high_repeats=4)["severity"].cast(pl.String)) == {"medium"}


def test_fallback_on_csn_times_when_the_push_is_not_captured():
    w2 = Wire()
    w2.version(3.2, P2, P1, 0.7, 2, {"description": "B"})
    w2.version(3.5, P1, "10.77.0.93", 0.5, 1, {"description": "A"})  # A's push went elsewhere, not to P2
    f2 = run(w2.capture())
    assert f2["kind"].to_list() == ["probable_lost_update"] and f2["severity"][0] == "low"
    assert run(w2.capture(), fallback_delay_ns=100_000).height == 0  # CSNs 0.2 ms apart: beyond 0.1 ms


def test_ad_conflict_objects():
    w = Wire()
    r = w._row(ts_ns=T0, kind="entry", server="10.1.0.5", client="10.1.0.9", src="10.1.0.5", dst="10.1.0.9",
               dn="CN=web01\\0ACNF:5a1f0c2e-1b2c-4d5e-8f90-0123456789ab,OU=Servers,DC=corp",
               conflict_guid="5a1f0c2e-1b2c-4d5e-8f90-0123456789ab")
    f = run(w.capture())
    assert f["kind"].to_list() == ["ad_conflict_object"] and f["severity"][0] == "medium"
    assert r["frame"] in f["evidence_frames"][0].to_list()
    assert run(w.capture(), cnf_severity="low")["severity"][0] == "low"


def test_nothing_to_report_without_replication():
    empty = Wire().capture()
    assert run(empty).height == 0
    w = Wire()
    w.write(0.0, A, P1, "A")
    assert run(w.capture()).height == 0


# -- the real recordings --------------------------------------------------------------------------------

REAL = [("ldap-repl-conflict.pcap", "ldap-repl-conflict-healthy.pcap"),
        ("eval/ldap-repl-conflict-12.pcap", "eval/ldap-repl-conflict-12-healthy.pcap"),
        ("eval/ldap-repl-near-miss.pcap", "eval/ldap-repl-near-miss-healthy.pcap"),
        ("eval/ldap-repl-two-attrs.pcap", "eval/ldap-repl-two-attrs-healthy.pcap")]


@pytest.mark.parametrize("sick,twin", REAL)
def test_real_recordings_fire_and_their_twins_stay_silent(sick, twin):
    from analyzer import open_capture

    if not (SAMPLES / sick).exists():
        pytest.skip(f"{sick} not recorded (samples/make_real.py / make_eval.py)")
    f = detectors.run(open_capture(SAMPLES / sick), only=["replication_conflict"])
    ranks = f["severity"].to_physical()
    assert f.height >= 1 and int(ranks.min()) >= 2  # every finding medium or worse
    assert set(f["kind"]) <= {"lost_update", "divergence"}
    g = detectors.run(open_capture(SAMPLES / twin), only=["replication_conflict"])
    assert g.height == 0
