"""The protocol registry: the one place that lists the decoders.

Importing this module imports every decoder, so its frame builders are registered with
``analyzer.capture`` (``cap.frame("dns_messages")`` works once it is imported; ``analyzer`` does it
on the first request for such a frame). Everything that names protocols asks here:

    from analyzer.decoders.registry import protocols, transaction_frames
    [p.name for p in protocols()]          # ["dns", "kerberos", "ldap", "smb2"]
    transaction_frames()                    # ("dns_transactions", ..., "smb2_transactions")

``module(name)`` is the decoder module that declared it (its ``outcome_rules()`` for ``stats --help``).

Adding a protocol: write ``analyzer/decoders/<name>.py`` with ``PROTOCOL = Protocol(...)`` and its
``@frame_builder`` functions, and add its module name to :data:`PROTOCOL_MODULES`.
"""
from __future__ import annotations

import importlib

from ..capture import FRAME_BUILDERS
from ..schema import FRAMES
from ..tcp.framing import FRAMINGS
from .protocol import Protocol

# The registration: decoder modules of analyzer.decoders, in the order protocols are listed.
PROTOCOL_MODULES = ("dns", "kerberos", "ldap", "smb2", "nfs", "rocev2", "http")

_REGISTERED: dict[str, Protocol] = {}
_MODULES: dict[str, object] = {}  # name -> the decoder module that declared it


def register(module) -> Protocol:
    """Register a decoder module (its ``PROTOCOL``); its frame builders registered themselves when it
    was imported. Returns the declaration. Registering the same name again replaces it."""
    proto: Protocol = module.PROTOCOL
    missing = [f for f in proto.frames if f not in FRAME_BUILDERS]
    if missing:
        raise ValueError(f"{proto.name}: no frame builder for {', '.join(missing)} (a @frame_builder in its module)")
    if proto.tcp_framing is not None and proto.tcp_framing not in FRAMINGS:
        raise ValueError(f"{proto.name}: tcp_framing {proto.tcp_framing!r} is not one of {', '.join(FRAMINGS)}")
    _REGISTERED[proto.name] = proto
    _MODULES[proto.name] = module
    return proto


def unregister(name: str) -> None:
    """Forget a protocol and the builders of its frames (tests that register a throwaway decoder)."""
    proto = _REGISTERED.pop(name, None)
    _MODULES.pop(name, None)
    for frame in proto.frames if proto is not None else ():
        FRAME_BUILDERS.pop(frame, None)
        FRAMES.pop(frame, None)


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


def module(name: str):
    """The decoder module that declared protocol ``name`` (its ``outcome_rules()``, its builders)."""
    protocol(name)  # KeyError naming the known ones
    return _MODULES[name]


def titles(*, with_transactions: bool = False) -> dict[str, str]:
    """name -> title ("dns" -> "DNS") of every registered protocol (only those with a transactions
    frame when ``with_transactions``), in registration order."""
    return {p.name: p.title for p in protocols() if p.transactions or not with_transactions}


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
