"""The dashboard app: :func:`main` builds it (``streamlit_app.py`` calls it; tests call it through
Streamlit's ``AppTest``).

The sidebar picks the capture (the command line's files; without any, a bundled sample, an upload or a
path under the root directory), the page, and detector parameter overrides. The page functions are in
:mod:`dashboards.pages`. Deep links: ``?page=Findings&finding=<finding_id>``.
"""
from __future__ import annotations

import logging
import os

import streamlit as st

from . import data as D
from .dissect import tshark_path
from .pages import PAGE_FUNCTIONS, PAGES, plain

log = logging.getLogger("herdscope.dashboard")

JOINED = "all files, joined in time order"


def _source_from_files(settings: D.Settings) -> tuple[str, tuple[str, ...]] | None:
    files = list(settings.files)
    if len(files) == 1:
        return os.path.basename(files[0]), (files[0],)
    options = [os.path.basename(f) for f in files] + [JOINED]
    choice = st.sidebar.radio("Capture", options, key="source_file",
                              help="Several files can be read as one capture (a ring buffer's pieces).")
    if choice == JOINED:
        return f"{len(files)} files joined", tuple(files)
    return choice, (files[options.index(choice)],)


def _source_picker(settings: D.Settings) -> tuple[str, tuple[str, ...]] | None:
    how = st.sidebar.radio("Open", ("Bundled sample", "Upload", "Path"), key="source_kind", horizontal=True)
    if how == "Bundled sample":
        samples = D.bundled_samples(settings.samples)
        if not samples:
            st.sidebar.info("No bundled samples found.")
            return None
        names = [s["file"] for s in samples]
        name = st.sidebar.selectbox("Sample", names, index=None, key="sample", placeholder="Choose a sample…")
        if name is None:
            return None
        sample = samples[names.index(name)]
        if sample["what_happened"]:
            st.sidebar.caption(("Healthy twin. " if sample["healthy"] else "") + sample["what_happened"])
        return name, (sample["path"],)
    if how == "Upload":
        upload = st.sidebar.file_uploader(f"Capture file (pcap, pcapng, optionally gzip; at most "
                                          f"{settings.max_upload_mb} MB)", key="upload")
        st.sidebar.caption(f"Upload limit: {settings.max_upload_mb} MB (herdscope dashboard --max-upload-mb).")
        if upload is None:
            return None
        if upload.size > settings.max_upload_mb * 1024 * 1024:
            st.sidebar.error(f"{plain(upload.name)} is larger than the {settings.max_upload_mb} MB limit.")
            return None
        path = D.save_upload(upload.name, upload.getvalue())
        return upload.name, (str(path),)
    root = settings.browse_root
    st.sidebar.caption(f"Files under `{root}` only (herdscope dashboard --root DIR).")
    known = D.captures_under(root)
    text = st.sidebar.text_input("Path (relative to the root, or absolute inside it)", key="path_text",
                                 placeholder=known[0] if known else "captures/trace.pcapng")
    if known:
        with st.sidebar.expander(f"Captures under the root ({len(known)}{'+' if len(known) >= 200 else ''})"):
            st.code("\n".join(known[:50]), language=None)
    if not text:
        return None
    try:
        path = D.resolve_under_root(text, root)
    except D.PathRejected as exc:
        st.sidebar.error(plain(exc))
        return None
    return os.path.basename(path), (str(path),)


def _overrides_box() -> None:
    with st.sidebar.expander("Detector parameters"):
        text = st.text_area("One DETECTOR.PARAMETER=VALUE per line (as scan --set)", key="overrides_text",
                            placeholder="herd.min_clients=20")
        try:
            st.session_state["overrides"] = D.parse_overrides(text)
        except ValueError as exc:
            st.error(plain(exc))
            st.session_state["overrides"] = {}


def _apply_query_params() -> None:
    """Deep links, once per session: ?page=Findings&finding=<id>."""
    if st.session_state.get("_query_applied"):
        return
    st.session_state["_query_applied"] = True
    page = st.query_params.get("page")
    if page:
        match = next((p for p in PAGES if p.lower() == page.lower()), None)
        if match:
            st.session_state["page"] = match
    finding = st.query_params.get("finding")
    if finding:
        st.session_state["finding_id"] = finding
        st.session_state.setdefault("page", "Findings")


def main(settings: D.Settings | None = None) -> None:
    """Build the app for one run of the script."""
    settings = settings or D.Settings.from_env()
    st.set_page_config(page_title="herdscope", page_icon="🐑", layout="wide")
    _apply_query_params()
    st.sidebar.title("herdscope")
    source = _source_from_files(settings) if settings.files else _source_picker(settings)
    page = st.sidebar.radio("Page", PAGES, key="page")
    _overrides_box()
    st.sidebar.caption("tshark: " + (tshark_path() or "not installed (no Wireshark dissection)"))
    if source is None:
        _welcome(settings)
        return
    label, paths = source
    loaded, problem = D.load(label, paths)
    if problem:
        st.error(plain(problem))
        st.caption("herdscope reads pcap and pcapng files (optionally gzip-compressed). A capture cut short "
                   "is read up to the damage; a file that is not a capture at all cannot be read.")
        return
    st.sidebar.caption(f"{loaded.cap.packets.height:,} packets · {len(paths)} file{'s' if len(paths) > 1 else ''}")
    try:
        PAGE_FUNCTIONS[page](loaded)
    except Exception as exc:  # noqa: BLE001 - a message on the page, the traceback in the server's log
        log.exception("page %s on %s", page, paths)
        st.error(f"This page could not be drawn for {plain(label)}: {type(exc).__name__}: {plain(exc)}")


def _welcome(settings: D.Settings) -> None:
    st.header("herdscope")
    st.markdown(
        "Find timing pathologies in packet captures — herds, retry storms, SMB break queues, TCP stalls, "
        "TOCTOU races and connection churn — and see the traffic that proves them.\n\n"
        "Pick a **bundled sample**, **upload** a capture "
        f"(at most {settings.max_upload_mb} MB) or type a **path** under `{settings.browse_root}` in the sidebar.")
    samples = D.bundled_samples(settings.samples)
    if samples:
        st.dataframe([{k: s[k] for k in ("file", "scenario", "healthy", "what_happened")} for s in samples],
                     hide_index=True, width="stretch")
