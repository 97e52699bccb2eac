"""The pages: one function each, given the loaded capture (:class:`dashboards.data.Loaded`).

Overview, Findings (with the evidence drill-down), Transactions and Downloads. Pages read their data
through the cached loaders in :mod:`dashboards.data` and draw charts built by :mod:`dashboards.charts`.
Selection state lives in ``st.session_state``: ``page``, ``finding_id`` (the finding shown on the
Findings page; the Overview timeline and the findings table set it).
"""
from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import zipfile

import polars as pl
import streamlit as st

from analyzer.durations import fmt_ns
from analyzer.summary import iso_time
from detectors import expanded, top_level, worst_first
from detectors.base import SEVERITIES

from . import charts
from . import data as D
from .dissect import MAX_FRAMES, DissectError, dissect, tshark_path
from .proofs import parameters_of, proof_charts
from .frames import (SRT_MS, display_table, evidence_locations, findings_table, ms_columns, number_config,
                     packet_rows, srt_table, wireshark_command)

log = logging.getLogger("herdscope.dashboard")

PAGES = ("Overview", "Findings", "Transactions", "Downloads")
# Markdown badges per severity (Streamlit's :colour-badge[] syntax), close to the charts' severity colours
SEVERITY_BADGE = {"informational": ":gray-badge[informational]", "low": ":blue-badge[low]",
                  "medium": ":orange-badge[medium]", "high": ":red-badge[high]", "critical": ":red-badge[**CRITICAL**]"}
DISSECT_DEFAULT = 5  # evidence frames dissected before the user asks for more
_MD_SPECIAL = set("\\`*_{}[]<>()#+-.!|~$:=^&\"'")


def plain(text: str) -> str:
    """``text`` for a Markdown element, shown as written: every ASCII punctuation character is
    backslash-escaped (CommonMark allows it), so SMB paths keep their backslashes, ``$`` starts no
    formula and ``:red[x]`` is no colour directive. (Streamlit still draws ``->`` as an arrow.)"""
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in str(text))


def finding_label(row: dict, t0_ns: int) -> str:
    what = row.get("resource") or row.get("client") or row.get("server") or ""
    return (f"{str(row['severity']).upper()} · {row['detector']}"
            f"{'/' + row['kind'] if row.get('kind') else ''} · {what} @ {(row['start_ns'] - t0_ns) / 1e9:.3f} s")


def select_finding(finding_id: str | None, go: bool = True) -> None:
    """Make ``finding_id`` the finding shown (and switch to the Findings page when ``go``)."""
    if not finding_id:
        return
    st.session_state["finding_id"] = finding_id
    st.session_state["finding_select"] = finding_id
    if go:
        st.session_state["page"] = "Findings"


def _on_pick(chart_key: str) -> None:
    """A click on a bar of the chart under ``chart_key`` (the findings timeline, an incident's lanes)
    opens that finding."""
    event = st.session_state.get(chart_key)
    picked = (event or {}).get("selection", {}).get(charts.PICK) or []
    if picked and picked[0].get("finding_id"):
        select_finding(picked[0]["finding_id"])


def _on_timeline_pick() -> None:
    _on_pick("timeline")


@st.cache_data(max_entries=16, show_spinner="Linking the findings into incidents…")
def _incidents(key: tuple, overrides_json: str, _found: pl.DataFrame, _cap) -> list[dict]:
    """The findings linked into incidents (:func:`detectors.incidents.link`, ``incident.*`` overrides
    applied; a bad one falls back to the defaults, the settings page reports it)."""
    from detectors import ParameterError, incident_params, incidents

    try:
        params = incident_params(json.loads(overrides_json))
    except ParameterError:
        params = incidents.Params()
    return incidents.link(_found, _cap, params)


def incidents_section(ld: D.Loaded, found_all: pl.DataFrame) -> None:
    """Each incident as swim lanes (one per protocol and server), its likely trigger and why."""
    overrides_json = json.dumps(st.session_state.get("overrides", {}), sort_keys=True)
    linked = _incidents(ld.key, overrides_json, found_all, ld.cap)
    if not linked:
        return
    st.subheader(f"Incidents ({len(linked)})")
    st.caption("Findings linked by time and shared clients or servers (`herdscope scan` prints the same); "
               "click a bar to open that finding.")
    by_id = {r["finding_id"]: r for r in found_all.iter_rows(named=True)}
    for k, inc in enumerate(linked):
        chart_key = f"incident_{k}"
        st.altair_chart(charts.incident_lanes(inc, found_all, t0_ns=ld.t0_ns), key=chart_key,
                        on_select=lambda chart_key=chart_key: _on_pick(chart_key), selection_mode=charts.PICK,
                        width="stretch")
        trigger = by_id.get(inc["trigger"])
        name = finding_label(trigger, ld.t0_ns) if trigger else inc["trigger"]
        st.markdown(f"{SEVERITY_BADGE[inc['severity']]} {plain(inc['summary'])}  \n"
                    f"**Likely trigger:** {plain(name)}, because:\n"
                    + "\n".join(f"- {plain(why)}" for why in inc["trigger_reasons"]))


def _findings(ld: D.Loaded) -> tuple[pl.DataFrame, dict[str, str], list[str]]:
    return D.findings(ld.key, ld.cap, json.dumps(st.session_state.get("overrides", {}), sort_keys=True))


def _detector_problems(errors: dict[str, str]) -> None:
    for name, message in errors.items():
        st.warning(f"Detector **{name}** did not run: {plain(message)}")


# -- Overview ------------------------------------------------------------------------------------------

def overview_page(ld: D.Loaded) -> None:
    st.header(f"Overview — {plain(ld.label)}")
    s = D.summary(ld.key, ld.cap)
    if s["damage"]:
        d = s["damage"]
        where = (f" at byte {d['offset']:,} ({d['bytes_not_read']:,} bytes not read)"
                 if d.get("offset") is not None else "")
        st.warning(f"The capture is damaged: {plain(d['reason'])}{where}. Everything before the damage was read.")
    if s["skipped"]["total"]:
        reasons = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s["skipped"]["reasons"].items())
        st.info(f"{s['skipped']['total']:,} records were skipped ({reasons}).")
    found_all, errors, ran = _findings(ld)
    found = top_level(found_all)  # a population's members are on its Findings page entry
    cols = st.columns(5)
    cols[0].metric("Packets", f"{s['packets']:,}")
    cols[1].metric("Duration", fmt_ns(s["duration_s"] * 1e9))
    cols[2].metric("Format", s["format"].split(" (")[0] + (" (gzip)" if s["compressed"] else ""))
    cols[3].metric("Data", f"{s['bytes'] / 1e6:,.2f} MB")
    worst = str(worst_first(found)["severity"][0]) if found.height else None
    cols[4].metric("Findings", f"{found.height:,}", worst and f"worst: {worst}", delta_color="off", delta_arrow="off")
    st.caption(f"{s['first_time'] or 'n/a'} .. {s['last_time'] or 'n/a'} · {_resolution_text(s)} · "
               f"detectors run: {', '.join(ran) or 'none installed'}" if s["ts_resolution_ns"] is not None else "")
    _detector_problems(errors)

    incidents_section(ld, found_all)
    chart = charts.findings_timeline(found, t0_ns=ld.t0_ns, t1_ns=ld.t1_ns)
    if found.height:
        st.altair_chart(chart, key="timeline", on_select=_on_timeline_pick, selection_mode=charts.PICK,
                        width="stretch")
        st.caption("Click a bar to open that finding on the Findings page.")
        counts = dict(found.group_by(pl.col("severity").cast(pl.String)).len().iter_rows())
        st.markdown(" ".join(f"{SEVERITY_BADGE[sv]} {counts.get(sv, 0)}" for sv in reversed(SEVERITIES)))
    else:
        st.success("No findings: " + (f"none of {', '.join(ran)} reported anything." if ran
                                      else "no detectors are installed yet."))

    st.subheader("Transactions per protocol")
    st.caption("Requests paired with their responses; latencies in ms, quantiles as `herdscope stats`.")
    tx, problems = D.transactions(ld.key, ld.cap)
    for name, message in problems.items():
        st.warning(f"{name} could not be built: {plain(message)}")
    if tx.height:
        _table(srt_table(tx, by=("protocol",)), key="protocol_table", column_config=_srt_columns())
    else:
        st.info("No request/response transactions decoded in this capture.")
    left, right = st.columns(2)
    with left:
        st.subheader("Protocols (packets)")
        rows = [{"transport": t, "service": svc, "packets": n} for t, svcs in s["protocols"].items()
                for svc, n in svcs.items()]
        _table(pl.DataFrame(rows, schema={"transport": pl.String, "service": pl.String, "packets": pl.Int64}),
               height=min(400, 38 + 35 * max(len(rows), 1)))
    with right:
        tcp = s.get("tcp") or {}
        if tcp.get("connections"):
            st.subheader("TCP")
            _table(pl.DataFrame({"": ["connections", "segments", "retransmissions", "fast retransmissions",
                                            "spurious retransmissions", "zero windows", "duplicate ACKs",
                                            "lost segments"],
                                       "count": [tcp["connections"], tcp["segments"], tcp["retransmissions"],
                                                 tcp["fast_retransmissions"], tcp["spurious_retransmissions"],
                                                 tcp["zero_windows"], tcp["duplicate_acks"], tcp["lost_segments"]]}))


def _table(table: pl.DataFrame, column_config: dict | None = None, **options):
    """``st.dataframe`` of ``table`` with missing values shown as "—", never as None."""
    config = column_config or {}
    formats = {k: (v.get("type_config") or {}).get("format") for k, v in config.items() if isinstance(v, dict)}
    shown = display_table(table, {k: f for k, f in formats.items() if f})
    return st.dataframe(shown, hide_index=True, width="stretch", column_config=number_config(shown, config) or None,
                        **options)


def _resolution_text(s: dict) -> str:
    """Declared and effective timestamp resolution, for the Overview caption."""
    declared, effective = s["ts_resolution_ns"], s.get("effective_resolution_ns")
    text = f"time resolution {fmt_ns(declared)} declared"
    if effective is not None and any(i.get("effective_resolution_ns", 0) > i["ts_resolution_ns"]
                                     for i in s["interfaces"]):
        text += f", {fmt_ns(effective)} effective (the timestamps' own tick: nothing shorter can be seen)"
    return text


def _srt_columns() -> dict:
    return {f"{c}_ms": st.column_config.NumberColumn(f"{c} (ms)", format="%.3f") for c in SRT_MS}


# -- Findings ------------------------------------------------------------------------------------------

def _filter_findings(found: pl.DataFrame) -> pl.DataFrame:
    c1, c2, c3, c4, c5 = st.columns([2, 2, 2, 2, 3])
    detectors = sorted(found["detector"].unique().to_list())
    chosen = c1.multiselect("Detector", detectors, key="f_detector", placeholder="all")
    severities = c2.multiselect("Severity", list(reversed(SEVERITIES)), key="f_severity", placeholder="all")
    client = c3.text_input("Client contains", key="f_client")
    server = c4.text_input("Server contains", key="f_server")
    resource = c5.text_input("Resource contains", key="f_resource")
    out = found
    if chosen:
        out = out.filter(pl.col("detector").is_in(chosen))
    if severities:
        out = out.filter(pl.col("severity").cast(pl.String).is_in(severities))
    for column, text in (("client", client), ("server", server), ("resource", resource)):
        if text:
            out = out.filter(pl.col(column).fill_null("").str.contains(text, literal=True))
    return out


def _on_table_pick() -> None:
    event = st.session_state.get("findings_table")
    rows = (event or {}).get("selection", {}).get("rows") or []
    ids = st.session_state.get("_table_ids") or []
    if rows and rows[0] < len(ids):
        select_finding(ids[rows[0]], go=False)


def _on_select_box() -> None:
    st.session_state["finding_id"] = st.session_state.get("finding_select")


def findings_page(ld: D.Loaded) -> None:
    st.header(f"Findings — {plain(ld.label)}")
    found, errors, ran = _findings(ld)
    _detector_problems(errors)
    if found.height == 0:
        st.success("No findings. " + (f"Detectors run: {', '.join(ran)}." if ran
                                      else "No detectors are installed yet."))
        return
    shown = _filter_findings(top_level(found))  # populations stand for their members (drill down below)
    st.caption(f"{shown.height:,} of {top_level(found).height:,} findings · select a row (or pick below) to see its "
               f"proof")
    table = findings_table(shown, ld.t0_ns).with_columns(shown["members"])
    st.session_state["_table_ids"] = table["finding_id"].to_list()
    _table(table, key="findings_table", on_select=_on_table_pick, selection_mode="single-row",
           column_config={"start_s": st.column_config.NumberColumn("start (s)", format="%.6f"),
                          "duration_ms": st.column_config.NumberColumn("duration (ms)", format="%.3f"),
                          "value": st.column_config.NumberColumn(format="%.4g"),
                          "threshold": st.column_config.NumberColumn(format="%.4g")})
    ids = table["finding_id"].to_list()
    if not ids:
        st.info("No finding matches the filters.")
        return
    labels = {r["finding_id"]: finding_label(r, ld.t0_ns) for r in shown.iter_rows(named=True)}
    current = st.session_state.get("finding_id")
    if current not in labels:
        if current is not None and current in set(found["finding_id"].to_list()):
            st.info("The finding picked earlier is hidden by the filters; showing the first that matches.")
        current = ids[0]
        st.session_state["finding_id"] = current
    st.session_state["finding_select"] = current
    st.selectbox("Finding", ids, key="finding_select", format_func=lambda i: labels.get(i, i),
                 on_change=_on_select_box)
    row = shown.filter(pl.col("finding_id") == current).row(0, named=True)
    finding_detail(ld, row, found)


def finding_detail(ld: D.Loaded, row: dict, found: pl.DataFrame) -> None:
    severity = str(row["severity"])
    st.subheader(f"{row['detector']}{'/' + row['kind'] if row['kind'] else ''}")
    st.markdown(SEVERITY_BADGE.get(severity, severity))
    st.info(plain(row["explanation"] or "(no explanation)"))
    m = st.columns(4)
    unit = f" {row['unit']}" if row["unit"] else ""
    m[0].metric(row["metric"] or "value", f"{row['value']:,.4g}{unit}" if row["value"] is not None else "n/a",
                f"threshold {row['threshold']:,.4g}{unit}" if row["threshold"] is not None else None, delta_color="off",
                delta_arrow="off")
    m[1].metric("Duration", fmt_ns(row["end_ns"] - row["start_ns"]))
    m[2].metric("Clients", f"{row['clients']:,}" if row["clients"] is not None else "n/a",
                row["client_identity"] and f"told apart by {row['client_identity']}", delta_color="off",
                delta_arrow="off")
    m[3].metric("Evidence frames", f"{row['evidence_total'] or 0:,}")
    facts = {
        "when": f"{(row['start_ns'] - ld.t0_ns) / 1e9:.6f} s .. {(row['end_ns'] - ld.t0_ns) / 1e9:.6f} s "
                f"({iso_time(row['start_ns'])} .. {iso_time(row['end_ns'])})",
        "client": row["client"] or "—", "server": row["server"] or "—", "resource": row["resource"] or "—",
        "finding id": row["finding_id"],
    }
    st.markdown("\n".join(f"- **{k}**: {plain(v)}" for k, v in facts.items()))
    tx, _ = D.transactions(ld.key, ld.cap)
    whole = st.toggle("Show the whole capture on the charts (they open zoomed on the finding)",
                      key=f"whole_{row['finding_id']}")
    try:
        proofs = proof_charts(ld.cap, row, found, tx, whole=whole)
    except Exception as exc:  # noqa: BLE001 - a chart that cannot be drawn must not hide the rest
        log.exception("proof chart for %s", row["finding_id"])
        proofs = []
        st.warning(f"The chart for this finding could not be drawn: {type(exc).__name__}: {plain(exc)}")
    for chart, caption in proofs:
        st.altair_chart(chart, width="stretch" if _fits(chart) else "content")
        if caption:
            st.caption(caption)
    with st.expander("Parameters the detector ran with", expanded=False):
        st.json(parameters_of(row))
    evidence_section(ld, row)
    if row.get("members"):
        population_members(ld, row, found)


def population_members(ld: D.Loaded, row: dict, found: pl.DataFrame) -> None:
    """A population finding's drill-down: its members (worst first) and any one of them in full."""
    st.subheader(f"Members ({row['members']:,})")
    members = expanded(found).filter(pl.col("member_of") == row["finding_id"])  # in member_ids order
    _table(findings_table(members, ld.t0_ns).with_columns(members["explanation"]), key=f"members_{row['finding_id']}")
    labels = {r["finding_id"]: finding_label(r, ld.t0_ns) for r in members.iter_rows(named=True)}
    pick = st.selectbox("Open a member", [None, *labels], key=f"member_pick_{row['finding_id']}",
                        format_func=lambda i: "—" if i is None else labels.get(i, i))
    if pick is not None:
        with st.container(border=True):
            finding_detail(ld, members.filter(pl.col("finding_id") == pick).row(0, named=True), found)


def _fits(chart) -> bool:
    """Single and layered charts stretch to the page; concatenated ones keep their panel width."""
    return not isinstance(chart, (charts.base.alt.VConcatChart, charts.base.alt.HConcatChart))


def evidence_section(ld: D.Loaded, row: dict) -> None:
    st.subheader("Evidence frames")
    frames = [int(f) for f in (row["evidence_frames"] or [])]
    if not frames:
        st.info("This finding lists no evidence frames.")
        return
    total = row["evidence_total"] or len(frames)
    st.caption(f"{len(frames)} of {total:,} evidence frames listed"
               + (" (capped by the detector)" if total > len(frames) else ""))
    _table(packet_rows(ld.cap, frames, ld.t0_ns),
           column_config={"time_s": st.column_config.NumberColumn("time (s)", format="%.6f")})
    locations = evidence_locations(ld.cap, frames)
    st.markdown("Open them all in Wireshark:")
    st.code("\n".join(wireshark_command(path, local) for path, local in locations), language="bash",
            wrap_lines=True)
    if len(locations) > 1 or (locations and len(ld.paths) > 1):
        st.caption("Frame numbers above count across the joined files (as mergecap -a); each line uses that "
                   "file's own numbers.")
    st.markdown("**Wireshark's dissection** (tshark via pyshark, only the frames picked)")
    picked = st.multiselect("Frames to dissect", frames, default=frames[:DISSECT_DEFAULT],
                            key=f"dissect_{row['finding_id']}", max_selections=MAX_FRAMES)
    tshark = tshark_path()
    if not tshark:
        st.warning("tshark is not installed, so Wireshark's own dissection cannot be shown here "
                   "(Debian: apt-get install tshark). The wireshark line above still works where Wireshark is.")
        return
    if not picked:
        return
    sizes = {p: r.records for p, r in (getattr(ld.cap, "reports", None) or [(ld.cap.path, ld.cap.report)])}
    for path, local in evidence_locations(ld.cap, sorted(picked)):
        try:
            result = _dissect_cached(path, tuple(local), tshark, sizes.get(path))
        except DissectError as exc:
            st.error(plain(exc))
            continue
        if result.note:
            st.caption(result.note)
        parts = result.frames
        for d in parts:
            where = f" ({os.path.basename(path)})" if len(ld.paths) > 1 else ""
            with st.expander(f"Frame {d.frame} — {d.summary}{where}", expanded=len(parts) == 1):
                st.code(d.text, language=None)


@st.cache_data(max_entries=64, show_spinner="tshark is dissecting…")
def _dissect_cached(path: str, frames: tuple[int, ...], tshark: str, total_packets: int | None):
    return dissect(path, list(frames), tshark, total_packets=total_packets)


# -- Transactions --------------------------------------------------------------------------------------

MAX_FILTER_OPTIONS = 500


def transactions_page(ld: D.Loaded) -> None:
    st.header(f"Transactions — {plain(ld.label)}")
    tx, problems = D.transactions(ld.key, ld.cap)
    for name, message in problems.items():
        st.warning(f"{name} could not be built: {plain(message)}")
    if tx.height == 0:
        st.info("No request/response transactions were decoded in this capture (herdscope pairs DNS, Kerberos, "
                "LDAP and SMB2 as their decoders are installed).")
        return
    c1, c2, c3, c4 = st.columns(4)
    protocols = c1.multiselect("Protocol", sorted(tx["protocol"].unique().to_list()), key="tx_protocol",
                               placeholder="all")
    sub = tx.filter(pl.col("protocol").is_in(protocols)) if protocols else tx
    clients = _busiest(sub, "client")
    servers = _busiest(sub, "server")
    chosen_clients = c2.multiselect("Client", clients, key="tx_client", placeholder="all")
    chosen_servers = c3.multiselect("Server", servers, key="tx_server", placeholder="all")
    colour = c4.selectbox("Colour by", ("operation", "protocol", "server", "client"), key="tx_colour")
    if chosen_clients:
        sub = sub.filter(pl.col("client").is_in(chosen_clients))
    if chosen_servers:
        sub = sub.filter(pl.col("server").is_in(chosen_servers))
    st.caption(f"{sub.height:,} of {tx.height:,} transactions"
               + (f" · the filters list the {MAX_FILTER_OPTIONS} busiest clients/servers" if
                  max(tx["client"].n_unique(), tx["server"].n_unique()) > MAX_FILTER_OPTIONS else ""))
    st.subheader("Service response time")
    if protocols or chosen_clients or chosen_servers:
        table = srt_table(sub)
    else:  # the whole capture: exactly `herdscope stats`, with SMB2 pending waits and break acks
        table = ms_columns(D.service_response_times(ld.key, ld.cap))
    _table(table, key="srt_table", column_config=_srt_columns())
    st.caption("As `herdscope stats`: quantiles are observed values (the \"higher\" rule); unanswered requests "
               "have no latency.")
    several = sub["protocol"].n_unique() > 1
    series_expr = (pl.format("{} {}", "protocol", "operation") if colour == "operation" and several
                   else pl.col(colour).fill_null("(none)"))
    sub = sub.with_columns(series_expr.alias("series"))
    st.altair_chart(charts.latency_histogram(sub), width="stretch")
    st.altair_chart(charts.latency_over_time(sub, t0_ns=ld.t0_ns), width="stretch")


def _busiest(tx: pl.DataFrame, column: str) -> list[str]:
    return (tx.group_by(column).len().sort("len", descending=True).head(MAX_FILTER_OPTIONS)
            .drop_nulls(column)[column].to_list())


# -- Downloads -----------------------------------------------------------------------------------------

def downloads_page(ld: D.Loaded) -> None:
    from detectors.report import capture_summary, finding_records, incident_records, render

    st.header(f"Downloads — {plain(ld.label)}")
    found, errors, ran = _findings(ld)
    _detector_problems(errors)
    base = os.path.splitext(os.path.basename(ld.paths[0]))[0] + ("-joined" if len(ld.paths) > 1 else "")
    label = "+".join(ld.paths)
    linked = _incidents(ld.key, json.dumps(st.session_state.get("overrides", {}), sort_keys=True), found, ld.cap)
    records = finding_records(found, label, ld.cap, linked)
    results = [(capture_summary(ld.cap, list(ld.paths), found, ran), records, incident_records(linked, label))]
    st.subheader(f"Findings ({found.height:,})")
    st.caption("The same documents as `herdscope scan --format json / ndjson / parquet` (schema in detectors/report.py).")
    c1, c2, c3 = st.columns(3)
    c1.download_button("Findings as JSON", render(results, [found], "json", "high"), f"{base}-findings.json",
                       "application/json", key="dl_json", on_click="ignore")
    c2.download_button("Findings as NDJSON", render(results, [found], "ndjson", "high") or "",
                       f"{base}-findings.ndjson", "application/x-ndjson", key="dl_ndjson", on_click="ignore")
    c3.download_button("Findings as Parquet", lambda: _parquet(found.with_columns(pl.lit(label).alias("capture"))),
                       f"{base}-findings.parquet", "application/vnd.apache.parquet", key="dl_findings_parquet",
                       on_click="ignore")
    st.subheader("Frames")
    st.caption("Every frame herdscope derives from the capture, as Parquet (built when asked for; "
               "column descriptions in the zip's schema.json, as `herdscope export` writes).")
    names = ld.cap.frame_names()
    c1, c2 = st.columns([2, 3])
    name = c1.selectbox("Frame", names, index=names.index("packets") if "packets" in names else 0, key="dl_frame")
    c2.download_button(f"{name}.parquet", lambda: _parquet(ld.cap.frame(name)), f"{base}-{name}.parquet",
                       "application/vnd.apache.parquet", key="dl_frame_parquet", on_click="ignore")
    st.download_button("All frames (zip of Parquet files + schema.json)", lambda: _zip_frames(ld.cap),
                       f"{base}-frames.zip", "application/zip", key="dl_zip", on_click="ignore")


def _parquet(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_parquet(buf)
    return buf.getvalue()


def _zip_frames(cap) -> bytes:
    from analyzer.export import export_frames

    with tempfile.TemporaryDirectory(prefix="herdscope-export-") as tmp:
        export_frames(cap, tmp)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for entry in sorted(os.listdir(tmp)):
                zf.write(os.path.join(tmp, entry), entry)
        return buf.getvalue()


PAGE_FUNCTIONS = {"Overview": overview_page, "Findings": findings_page, "Transactions": transactions_page,
                  "Downloads": downloads_page}
