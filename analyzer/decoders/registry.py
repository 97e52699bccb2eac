"""The protocol registry: the one place that lists the decoders.

Importing this module imports every decoder, so its frame builders are registered with
``analyzer.capture`` (``cap.frame("dns_messages")`` works once it is imported; ``analyzer`` does it
on the first request for such a frame). Everything that names protocols asks here:

    from analyzer.decoders.registry import protocols, transaction_frames
    [p.name for p in protocols()]          # ["dns", "kerberos", "ldap", "smb2"]
    transaction_frames()                    # ("dns_transactions", ..., "smb2_transactions")

Adding a protocol: write ``analyzer/decoders/<name>.py`` with ``PROTOCOL = Protocol(...)`` and its
``@frame_builder`` functions, and add its module name to :data:`PROTOCOL_MODULES`.
"""
from __future__ import annotations

import importlib

from .protocol import Protocol

# The registration: decoder modules of analyzer.decoders, in the order protocols are listed.
PROTOCOL_MODULES = ("dns", "kerberos", "ldap", "smb2")

_REGISTERED: dict[str, Protocol] = {}


def register(module) -> Protocol:
    """Register a decoder module (its ``PROTOCOL``); its frame builders registered themselves when it
    was imported. Returns the declaration. Registering the same name again replaces it."""
    proto: Protocol = module.PROTOCOL
    _REGISTERED[proto.name] = proto
    return proto


def unregister(name: str) -> None:
    """Forget a protocol (tests that register a throwaway decoder)."""
    _REGISTERED.pop(name, None)


for _name in PROTOCOL_MODULES:
    register(importlib.import_module(f"{__package__}.{_name}"))


def protocols() -> tuple[Protocol, ...]:
    """Every registered protocol, in registration order."""
    return tuple(_REGISTERED.values())


def protocol(name: str) -> Protocol:
    """The declaration of protocol ``name`` (KeyError naming the known ones)."""
    try:
        return _REGISTERED[name]
    except KeyError:
        raise KeyError(f"no protocol named {name!r}; known: {', '.join(_REGISTERED)}") from None


def transaction_frames() -> tuple[str, ...]:
    """The frames that start with common.TRANSACTION_COMMON, one per protocol that pairs requests."""
    return tuple(p.transactions for p in protocols() if p.transactions)


def protocol_of_frame(frame: str) -> Protocol | None:
    """The protocol whose decoder builds ``frame`` (None for the reader's and TCP's frames)."""
    return next((p for p in protocols() if frame in p.frames), None)


def service_names() -> dict[int, str]:
    """port -> service name declared by the decoders (info's port table adds tshark's others)."""
    out: dict[int, str] = {}
    for p in protocols():
        out.update(p.services)
    return out
