"""Columns every transaction frame has, whatever the protocol, so ``herdscope stats`` and the
detectors can treat DNS, Kerberos, LDAP and SMB2 alike. Protocol-specific columns follow these.
"""
import numpy as np
import polars as pl

from ..messages import TRANSPORTS
from ..schema import Column, _col

TRANSACTION_COMMON: tuple[Column, ...] = (
    _col("protocol", object, "dns, kerberos, ldap or smb2", polars=pl.String),
    _col("transport", object, "udp or tcp", polars=TRANSPORTS),
    _col("flow", np.uint32, "flow (UDP) or connection (TCP) id, as in the message frame"),
    _col("client", object, "client address (the requester)", polars=pl.String),
    _col("client_port", np.uint16, "client port: many clients can share one address (NAT, processes)"),
    _col("server", object, "server address", polars=pl.String),
    _col("server_port", np.uint16, "server port"),
    _col("operation", object, "what was asked, in the protocol's words (e.g. A, AS-REQ, searchRequest, "
         "CREATE)", polars=pl.String),
    _col("resource", object, "what it was about (DNS name, principal, DN, share/path), null when none",
         polars=pl.String),
    _col("request_frame", np.uint32, "frame of the request (its last segment for TCP)"),
    _col("response_frame", np.uint32, "frame of the final response; null when unanswered"),
    _col("request_ts_ns", np.int64, "time of the request"),
    _col("response_ts_ns", np.int64, "time of the final response; null when unanswered"),
    _col("latency_ns", np.int64, "response_ts_ns - request_ts_ns: the service response time"),
    _col("status", object, "outcome, in the protocol's names (NOERROR, KDC_ERR_PREAUTH_REQUIRED, success, "
         "STATUS_SUCCESS ...); null when unanswered", polars=pl.String),
    _col("is_error", np.bool_, "the outcome is a failure (the protocol's own notion; see each decoder)"),
    _col("answered", np.bool_, "a final response was seen"),
)

COMMON_NAMES = tuple(c.name for c in TRANSACTION_COMMON)
