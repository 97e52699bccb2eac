"""ldap_sync against tshark, field by field, on the real two-provider syncrepl recordings
(samples/ldap-repl-conflict*.pcap, samples/eval/ldap-repl-*.pcap: the corpus has no RFC 4533 traffic).

Per frame that carries exactly one LDAPMessage (tshark joins the fields of several with commas):
Sync State state / entryUUID / cookie, Sync Request mode / reloadHint / cookie, Sync Info choice /
newcookie / cookie / refreshDone, Sync Done cookie / refreshDeletes, the attribute names of entries and
modify requests (ldap.type) and the entryCSN value among the attribute values (ldap.AttributeValue).
Deliberate differences: tshark shows the syncUUID as 32 hex digits, we as RFC 4122 text; cookies and
values as hex octets there, text here; tshark's SyncInfoValue is the CHOICE index, ours its name.
"""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyzer import open_capture
from analyzer.decoders.ldap_sync import INFOS
from tshark_ref import have_tshark, tshark_fields

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FILES = [p for p in [SAMPLES / "ldap-repl-conflict.pcap", SAMPLES / "ldap-repl-conflict-healthy.pcap",
                     *sorted((SAMPLES / "eval").glob("ldap-repl-*.pcap"))] if p.exists()]
FIELDS = ["frame.number", "ldap.messageID", "ldap.state", "ldap.entryUUID", "ldap.cookie", "ldap.mode",
          "ldap.reloadHint", "ldap.SyncInfoValue", "ldap.newcookie", "ldap.refreshDone", "ldap.refreshDeletes",
          "ldap.type", "ldap.AttributeValue"]
pytestmark = [pytest.mark.tshark, pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]


def _text(hexes: str) -> str:
    return bytes.fromhex(hexes).decode("utf-8", "replace") if hexes else ""


def _bool(v: str):
    return None if v == "" else v in ("1", "True", "true")


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_ldap_sync_agrees_with_tshark(path):
    ours = open_capture(path).frame("ldap_sync")
    ref = tshark_fields(path, FIELDS, display_filter="ldap").with_columns(pl.all().cast(pl.String).fill_null(""))
    ref = {int(r["frame.number"]): r for r in ref.iter_rows(named=True) if "," not in r["ldap.messageID"]}
    one = ours.group_by("frame").len().filter(pl.col("len") == 1)["frame"]
    rows = ours.filter(pl.col("frame").is_in(one.implode()))
    checked = {"sync_state": 0, "sync_info": 0, "sync_request": 0, "modify": 0, "entry": 0}
    for r in rows.iter_rows(named=True):
        t = ref.get(r["frame"])
        assert t is not None, f"frame {r['frame']}: tshark shows no single LDAPMessage"
        kind = r["kind"]
        where = f"{path.name} frame {r['frame']} ({kind})"
        assert int(t["ldap.messageID"]) == r["message_id"], where
        if kind == "sync_state":
            assert int(t["ldap.state"]) == ["present", "add", "modify", "delete"].index(r["state"]), where
            assert t["ldap.entryUUID"].replace(":", "") == r["entry_uuid"].replace("-", ""), where
            assert _text(t["ldap.cookie"]) == (r["cookie"] or ""), where
        elif kind == "sync_request":
            assert int(t["ldap.mode"]) == {"refreshOnly": 1, "refreshAndPersist": 3}[r["sync_mode"]], where
            assert (_bool(t["ldap.reloadHint"]) or False) == bool(r["reload_hint"]), where
            assert _text(t["ldap.cookie"]) == (r["cookie"] or ""), where
        elif kind == "sync_info":
            assert INFOS[int(t["ldap.SyncInfoValue"])] == r["info"], where
            cookie = t["ldap.newcookie"] if r["info"] == "newcookie" else t["ldap.cookie"]
            assert _text(cookie) == (r["cookie"] or ""), where
            if t["ldap.refreshDone"]:
                assert _bool(t["ldap.refreshDone"]) == r["refresh_done"], where
        elif kind == "sync_done":
            assert _text(t["ldap.cookie"]) == (r["cookie"] or ""), where
            if t["ldap.refreshDeletes"]:
                assert _bool(t["ldap.refreshDeletes"]) == r["refresh_deletes"], where
        if kind in ("sync_state", "entry", "modify", "add"):
            assert t["ldap.type"].split(",") == r["attributes"], where
            if r["entry_csn"] is not None:
                assert r["entry_csn"] in [_text(v) for v in t["ldap.AttributeValue"].split(",")], where
        checked[kind] = checked.get(kind, 0) + 1
    assert checked["sync_state"] > 0 and checked["modify"] > 0 and checked["entry"] > 0, checked
    # every tshark Sync State / Sync Info frame is a row of ours
    states = {f for f, t in ref.items() if t["ldap.state"] or t["ldap.SyncInfoValue"]}
    assert states <= set(ours["frame"].to_list())
