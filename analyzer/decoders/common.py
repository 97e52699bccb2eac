"""Columns every transaction frame has, whatever the protocol, so ``herdscope stats`` and the
detectors can treat DNS, Kerberos, LDAP and SMB2 alike. Protocol-specific columns follow these.

:data:`TRANSACTION_COMMON` is the one copy of this schema: ``COMMON_NAMES``, the stacked-frame schema
:data:`TRANSACTION_TEXT_SCHEMA` and every decoder's transaction columns (``TRANSACTION_COMMON + (...)``)
derive from it.
"""
import numpy as np
import polars as pl

from ..durations import fmt_ns
from ..message_set import TRANSPORTS
from ..schema import Column, column, polars_type

TRANSACTION_COMMON: tuple[Column, ...] = (
    column("protocol", object, "dns, kerberos, ldap or smb2", polars=pl.String),
    column("transport", object, "udp or tcp", polars=TRANSPORTS),
    column("flow", np.uint32, "flow (UDP) or connection (TCP) id, as in the message frame"),
    column("client", object, "client address (the requester)", polars=pl.String),
    column("client_port", np.uint16, "client port: many clients can share one address (NAT, processes)"),
    column("server", object, "server address", polars=pl.String),
    column("server_port", np.uint16, "server port"),
    column("operation", object, "what was asked, in the protocol's words (e.g. A, AS-REQ, searchRequest, "
         "CREATE)", polars=pl.String),
    column("resource", object, "what it was about (DNS name, principal, DN, share/path), null when none",
         polars=pl.String),
    column("request_frame", np.uint32, "frame of the request (its last segment for TCP)"),
    column("response_frame", np.uint32, "frame of the final response; null when unanswered"),
    column("request_ts_ns", np.int64, "time of the request"),
    column("response_ts_ns", np.int64, "time of the final response; null when unanswered"),
    column("latency_ns", np.int64, "response_ts_ns - request_ts_ns: the service response time"),
    column("status", object, "outcome, in the protocol's names (NOERROR, KDC_ERR_PREAUTH_REQUIRED, success, "
         "STATUS_SUCCESS ...); null when unanswered", polars=pl.String),
    column("is_error", np.bool_, "the outcome is a failure (the protocol's own notion; see each decoder)"),
    column("answered", np.bool_, "a final response was seen"),
)

COMMON_NAMES = tuple(c.name for c in TRANSACTION_COMMON)


def _as_text(dtype: pl.DataType) -> pl.DataType:
    return pl.String if isinstance(dtype, (pl.Enum, pl.Categorical)) else dtype


# -- the words of a decoder's outcome_rules() (``stats --help``, the README) ----------------------------

def named_codes(table: dict[int, str], codes, conjunction: str = "or") -> str:
    """"NOERROR (0) or NXDOMAIN (3)": codes by their names in ``table``, in a sentence."""
    named = [f"{table[c]} ({c})" for c in codes]
    return ", ".join(named[:-1]) + f" {conjunction} " + named[-1] if len(named) > 1 else "".join(named)


def unbroken_duration(ns: int) -> str:
    """A duration whose value and unit stay on one line when the text is wrapped."""
    return fmt_ns(ns).replace(" ", "\u00a0")


# The common columns of every protocol stacked in one frame (stats.transactions, the dashboard's
# pages): TRANSACTION_COMMON's types with Enum columns (transport) as text, so protocols stack.
TRANSACTION_TEXT_SCHEMA = pl.Schema({c.name: _as_text(polars_type(c)) for c in TRANSACTION_COMMON})
