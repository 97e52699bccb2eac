"""Imports every decoder so its frame builders are registered with ``analyzer.capture``.

``cap.frame("dns_messages")`` etc. work once this module is imported (``analyzer`` does it).
"""
from . import dns  # noqa: F401
from . import smb2  # noqa: F401
from . import kerberos  # noqa: F401
from . import ldap  # noqa: F401
