"""Constants every part of the generator shares: time units, the capture's epoch, the site's realm
and domain, and the label schema."""
from __future__ import annotations

GENERATOR_VERSION = "1"
BASE_EPOCH_NS = 1_709_542_800 * 1_000_000_000     # 2024-03-04 09:00:00 UTC, a Monday morning
DETECTORS = ("herd", "retry_storm", "smb_break_queue", "tcp_stall", "toctou", "conn_churn")
LABEL_KEYS = ("detector", "start_ns", "end_ns", "clients", "server", "server_port", "protocol",
              "resource", "description", "parameters")
MIN_PACKETS = 1500

US = 1_000
MS = 1_000_000
SEC = 1_000_000_000
MASK32 = 0xFFFFFFFF

REALM = "CORP.EXAMPLE.COM"
DOMAIN = "corp.example.com"
