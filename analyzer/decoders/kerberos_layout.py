"""Kerberos wire layout shared by the Kerberos kernels and :mod:`analyzer.decoders.kerberos`: the
message types ([APPLICATION n] of RFC 4120 §5.10, §7.5.7), the PA-DATA types the decoder reads
(§7.5.2; RFC 6113; RFC 4556), the BER tags, and the kernels' field layout (``I_*`` int fields,
``S_*`` string slots). Numba freezes these module-level ints as compile-time constants (its cache
is keyed on each kernel's own source file: after changing a value here, touch the kernel modules or
clear the cache)."""
from __future__ import annotations

import numpy as np

from . import ber

# --- message types: [APPLICATION n] = msg-type (RFC 4120 §5.10, §7.5.7) ---------------------------------
AS_REQ = 10
AS_REP = 11
TGS_REQ = 12
TGS_REP = 13
AP_REQ = 14
AP_REP = 15
KRB_RESERVED16 = 16  # §7.5.7 (user-to-user TGT request / reply)
KRB_RESERVED17 = 17
KRB_SAFE = 20
KRB_PRIV = 21
KRB_CRED = 22
KRB_ERROR = 30

# --- PA-DATA types (RFC 4120 §7.5.2; PK-INIT RFC 4556 §3.2.1; FAST RFC 6113 §5.4.1, §5.4.6) ---------------
PA_TGS_REQ = 1
PA_ENC_TIMESTAMP = 2
PA_PK_AS_REQ_OLD = 14
PA_PK_AS_REQ = 16
PA_FX_FAST = 136
PA_ENC_CHALLENGE = 138

USEC_PER_SEC = 1_000_000  # KRB-ERROR cusec / susec (§5.9.1): microseconds, 0 .. 999999
NS_PER_USEC = 1000

# --- kernel field layout ---------------------------------------------------------------------------
(I_APP, I_MSG_TYPE, I_PVNO, I_NONCE, I_PREAUTH, I_PREAUTH_ETYPE, I_KDC_OPTIONS, I_TILL, I_TICKET_ETYPE,
 I_TICKET_KVNO, I_ENC_ETYPE, I_ENC_KVNO, I_ERROR_CODE, I_STIME, I_CTIME, I_STATUS, I_AP_OPTIONS, I_AUTH_CIPHER_START,
 I_AUTH_CIPHER_END) = (np.int64(k) for k in range(19))
N_INTS = 19  # the last three: a top-level AP-REQ's ap-options and authenticator cipher bytes (kerberos_ap)
(S_REALM, S_CREALM, S_CNAME, S_SNAME, S_ETYPES, S_PADATA, S_TGS_REALM, S_TGS_SNAME, S_ETEXT) = (
    np.int64(k) for k in range(9))
N_STRS = 9
STR_NAMES = ("realm", "crealm", "cname", "sname", "etypes", "padata_types", "tgs_ticket_realm",
             "tgs_ticket_sname", "e_text")
assert len(STR_NAMES) == N_STRS

# --- tags: the [n] of a SEQUENCE's components (each structure's docstring names them) -------------------
_CTX = [ber.ctx(k) for k in range(13)]
C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12 = _CTX
SEQ = ber.SEQUENCE
INT = ber.INTEGER
OCTETS = ber.OCTET_STRING
BITS = ber.BIT_STRING
GTIME = ber.GENERALIZED_TIME
APP_TICKET = ber.app(1)  # Ticket ::= [APPLICATION 1] (§5.3)
APP_AP_REQ = ber.app(AP_REQ)
APPLICATION_CONSTRUCTED = ber.APPLICATION | ber.CONSTRUCTED
# np.int64 rather than int literals as call arguments: see ber (one compiled specialisation each)
ANY_STRING = np.int64(-1)
COMMA = np.int64(44)
SLASH = np.int64(47)
YES = np.bool_(True)
NO = np.bool_(False)
