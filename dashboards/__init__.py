"""The herdscope dashboard: see the pathology, not just read about it.

``herdscope dashboard [FILE...]`` (:mod:`dashboards.launch`) starts Streamlit on
``dashboards/streamlit_app.py``, which calls :func:`dashboards.app.main`. The layers:

- :mod:`dashboards.charts` — pure chart builders: a Polars frame in, an Altair chart out. They never
  see a capture or Streamlit, aggregate or thin their data server-side to at most
  :data:`dashboards.charts.base.MAX_ROWS` rows per dataset, and *say so* in the chart's subtitle (and
  in ``usermeta["herdscope"]["notes"]``) whenever they did.
- :mod:`dashboards.proofs` — one module per detector (``dashboards/proofs/<detector>.py``): the frames a
  finding's proof needs, cut from the capture (pure Polars), its chart builders (as above) and the
  function registered for the detector with ``@proof_chart``; found by importing the package.
  :mod:`dashboards.frames` — the transactions of every protocol in one frame, service-response-time
  tables, evidence frame numbers per file, the Wireshark line.
- :mod:`dashboards.data` — loading: sources (files, bundled samples, uploads, paths under a root),
  the cached capture / findings / transactions loaders, tables (service response times).
- :mod:`dashboards.dissect` — Wireshark's own dissection of a few frames, through pyshark and tshark.
- :mod:`dashboards.pages` — one function per page (Overview, Findings, Transactions, Downloads).
- :mod:`dashboards.app` — the app: sidebar (source, navigation) and the page dispatch;
  :mod:`dashboards.settings` — what the launcher hands it; :mod:`dashboards.launch` — the command.
"""
