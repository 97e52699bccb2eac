"""herdscope's analyzer: reading captures into Polars frames and understanding them.

    from analyzer import open_capture
    with open_capture("trace.pcapng") as cap:
        cap.packets          # one row per record (see analyzer.schema)
        cap.report           # damage, skips and events met while reading
"""
from .capture import Capture, open_capture, open_captures
from .errors import HerdscopeError, UnreadableCapture

__version__ = "0.1.0"
__all__ = ["Capture", "open_capture", "open_captures", "HerdscopeError", "UnreadableCapture", "__version__"]
