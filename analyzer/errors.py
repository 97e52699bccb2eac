"""Errors a user can act on. Each carries a one-line message that names the file."""


class HerdscopeError(Exception):
    """Base class of herdscope's own errors."""


class UnreadableCapture(HerdscopeError):
    """The input cannot be read as a capture at all (missing, empty, not pcap/pcapng, bad gzip).

    Damage *inside* a readable capture (a truncated last record, a block with a bogus length) is not
    raised: the packets before it are kept and the damage is reported in the capture's read report.
    """
