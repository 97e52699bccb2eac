"""The script ``streamlit run`` executes (``herdscope dashboard`` starts it): the app is built by
:func:`dashboards.app.main`, with the settings the launcher put in ``$HERDSCOPE_DASHBOARD``."""
import os
import sys

# `streamlit run` puts this file's folder on sys.path, not the project: make `dashboards` importable
# from a source checkout too (an installed herdscope needs nothing).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dashboards.app import main  # noqa: E402

main()
