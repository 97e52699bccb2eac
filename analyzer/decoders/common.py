"""Columns every transaction frame has, whatever the protocol, so ``herdscope stats`` and the
detectors can treat DNS, Kerberos, LDAP and SMB2 alike. Protocol-specific columns follow these.
"""
import numpy as np
import polars as pl

from ..messages import TRANSPORTS
from ..schema import Column, column

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
