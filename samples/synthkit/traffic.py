"""Normal traffic of the site: DNS lookups (UDP, truncation and TCP fallback), Kerberos logons,
LDAP sessions, SMB2 sessions with quick oplock / lease breaks, HTTP sessions, syslog and refused
connections. Each builder draws from the site's random stream and appends to its store."""
from __future__ import annotations

import struct
import time

from .base import DOMAIN, MS, REALM, SEC, US
from .der import ctx, der_bool, der_gstring, der_int, der_seq
from .dns import AN, DNS_NX, DNS_Q, DNS_R, DNS_TC, EDNS_UDP_SIZE, NS, T_A, T_AAAA, T_CNAME, T_SOA, DnsBuilder
from .frames import PROTO_UDP, Host, Path
from .kerberos import (ETYPE_AES128, ETYPE_AES256, ETYPE_RC4, ETYPE_RC4_EXP, ETYPE_RC4_OLD_EXP,
                       KDC_ERR_C_PRINCIPAL_UNKNOWN, KDC_ERR_PREAUTH_FAILED, KDC_ERR_PREAUTH_REQUIRED, KDC_OPT_AS,
                       KDC_OPT_TGS, KRB_AS_REP, KRB_AS_REQ, KRB_TGS_REP, KRB_TGS_REQ, NT_PRINCIPAL, NT_SRV_INST,
                       PA_ENC_TIMESTAMP, PA_ETYPE_INFO2, PA_PAC_REQUEST, PA_PK_AS_REP_OLD, PA_PK_AS_REQ, PA_TGS_REQ,
                       krb_ap_req, krb_enc, krb_error, krb_etype_info2, krb_kdc_rep, krb_kdc_req,
                       krb_netbios_addresses, krb_padata, krb_principal, krb_req_body, krb_ticket)
from .ldap import MOD_REPLACE, SCOPE_BASE, f_and, f_eq, f_or, f_present, f_substr, ldap_search_entry
from .sessions import Ldap, Smb
from .site import FILE_NAMES, LDAP_BASE, SHARE_DIRS
from .smb2 import (FILE_OPEN, FILE_OPEN_IF, LEASE_H, LEASE_R, LEASE_W, OPLOCK_BATCH, OPLOCK_II, OPLOCK_LEASE,
                   OPLOCK_NONE, SMB2_CREATE, SMB2_OPLOCK_BREAK, ST_PENDING, smb2_error_body, smb2_lease_break_ack,
                   smb2_lease_break_notify, smb2_oplock_break)
from .tcp import Tcp


DNS_PORT, KRB_PORT, SYSLOG_PORT = 53, 88, 514      # RFC 1035 §4.2, RFC 4120 §7.2.3, RFC 5426 §3.3
AS_ETYPES = (ETYPE_AES256, ETYPE_AES128, ETYPE_RC4, ETYPE_RC4_EXP, ETYPE_RC4_OLD_EXP)   # a Windows client's list
SOA_TTL = 60                    # TTL of the SOA in negative / no-data answers (RFC 2308 §3)
EDNS_UDP_SIZE_LEGACY = 4096     # the payload size older resolvers advertise (RFC 6891 §6.2.5)
SERVICE_KVNO = 5                # key version of the service keys in service tickets


class Traffic:
    """The normal sessions; mixed into :class:`.generator.Gen` (needs :class:`.site.Site`'s state)."""

    # -- DNS ------------------------------------------------------------------------------------
    def _soa_for(self, name: str) -> tuple[str, tuple]:
        if name.endswith(DOMAIN):
            return DOMAIN, (f"dc01.{DOMAIN}", f"hostmaster.{DOMAIN}", 2024030401)
        apex = ".".join(name.split(".")[-2:])
        return apex, (f"ns1.{apex}", f"hostmaster.{apex}", 2024022901)

    def dns_query(self, txid: int, name: str, qtype: int, edns: bool) -> bytes:
        b = DnsBuilder(txid, DNS_Q).question(name, qtype)
        if edns:
            b.opt(EDNS_UDP_SIZE if self.rng.random() < 0.7 else EDNS_UDP_SIZE_LEGACY)
        return b.bytes()

    def dns_answer(self, txid: int, name: str, qtype: int, edns: bool, ttl: int | None = None,
                   tc: bool = False) -> bytes:
        z = self.zone[name]
        flags = DNS_NX if z.nx else DNS_R
        if tc:
            flags |= DNS_TC
        b = DnsBuilder(txid, flags).question(name, qtype)
        if z.nx:
            apex, soa = self._soa_for(name)
            b.rr(NS, apex, T_SOA, SOA_TTL, soa)
        elif not tc:
            owner, cur = name, z
            while cur.cname:
                b.rr(AN, owner, T_CNAME, cur.ttl if ttl is None else ttl, cur.cname)
                owner, cur = cur.cname, self.zone[cur.cname]
            addrs = cur.v4 if qtype == T_A else cur.v6
            for a in addrs:
                b.rr(AN, owner, qtype, cur.ttl if ttl is None else ttl, a)
            if not addrs:
                apex, soa = self._soa_for(owner)
                b.rr(NS, apex, T_SOA, SOA_TTL, soa)
        if edns:
            b.opt(EDNS_UDP_SIZE)
        return b.bytes()

    def dns_udp(self, t: int, cli: Host, name: str | None = None, qtypes=None,
                slow: bool | None = None) -> int:
        r = self.rng
        srv = self.dns6 if cli.v6 else self.dns
        if name is None:
            name = r.choice(self._names)
        if qtypes is None:
            qtypes = (T_A, T_AAAA) if (not cli.windows or r.random() < 0.25) else (T_A,)
        z = self.zone[name]
        edns = (not cli.windows) or r.random() < 0.5
        q, a = self.udp_pair(cli, srv, r.randrange(49152, 65536), DNS_PORT)
        if slow is None:
            slow = z.remote and r.random() < 0.3
        end = t
        for qt in qtypes:
            txid = r.getrandbits(16)
            self.store.udp(t, q, self.dns_query(txid, name, qt, edns))
            svc = r.randrange(3 * MS, 40 * MS) if slow else r.randrange(25 * US, 250 * US)
            ttl = None if slow else max(1, z.ttl - r.randrange(0, z.ttl))
            self.store.udp(t + svc, a, self.dns_answer(txid, name, qt, edns, ttl))
            end = max(end, t + svc)
            t += r.randrange(4 * US, 40 * US)
        return end

    def dns_tc_fallback(self, t: int, cli: Host) -> int:
        """A large answer: UDP reply truncated (TC) -> the same query over TCP."""
        r = self.rng
        name = "big.records." + DOMAIN
        q, a = self.udp_pair(cli, self.dns, r.randrange(49152, 65536), DNS_PORT)
        txid = r.getrandbits(16)
        self.store.udp(t, q, self.dns_query(txid, name, T_A, False))
        t1 = t + r.randrange(40 * US, 120 * US)
        self.store.udp(t1, a, self.dns_answer(txid, name, T_A, False, tc=True))
        c = Tcp(self, cli, self.dns, DNS_PORT)
        t2 = c.open(t1 + cli.rtt + r.randrange(50 * US, 200 * US))
        qry = self.dns_query(txid, name, T_A, False)
        ans = self.dns_answer(txid, name, T_A, False)
        # over TCP every message is prefixed with its two-byte length (RFC 1035 §4.2.2)
        t3 = c.send(t2 + r.randrange(5 * US, 30 * US), 0, struct.pack("!H", len(qry)) + qry)
        t4 = c.send(t3 + r.randrange(40 * US, 200 * US), 1, struct.pack("!H", len(ans)) + ans)
        return c.close(t4 + r.randrange(10 * US, 50 * US), 0)

    # -- Kerberos -------------------------------------------------------------------------------
    def krb_xchg(self, t: int, cli: Host, kdc: Host, req: bytes, rsp_fn, svc: int, tcp: bool) -> int:
        r = self.rng
        if tcp:
            c = Tcp(self, cli, kdc, KRB_PORT)   # TCP: a four-byte record mark (RFC 4120 §7.2.2)
            t = c.open(t) + r.randrange(10 * US, 60 * US)
            a = c.send(t, 0, struct.pack("!I", len(req)) + req)
            rsp = rsp_fn(a + svc)
            b = c.send(a + svc, 1, struct.pack("!I", len(rsp)) + rsp)
            c.close(b + r.randrange(20 * US, 100 * US), 0)
            return b
        q, a = self.udp_pair(cli, kdc, cli.ephemeral(), KRB_PORT)
        self.store.udp(t, q, req)
        self.store.udp(t + svc, a, rsp_fn(t + svc))
        return t + svc + cli.rtt

    def krb_as_req(self, cli: Host, user: str, nonce: int, preauth: bool) -> bytes:
        pad = [krb_padata(PA_PAC_REQUEST, der_seq(ctx(0, der_bool(True))))]
        if preauth:
            pad.insert(0, krb_padata(PA_ENC_TIMESTAMP, krb_enc(ETYPE_AES256, self.rng.randbytes(56))))
        addrs = krb_netbios_addresses(cli.name)
        body = krb_req_body(KDC_OPT_AS, REALM, krb_principal(NT_SRV_INST, "krbtgt", REALM), nonce,
                            krb_principal(NT_PRINCIPAL, user), AS_ETYPES, addrs, rtime=True)
        return krb_kdc_req(KRB_AS_REQ, pad, body)

    def krb_preauth_required(self, user: str, t: int) -> bytes:
        salt = REALM + user.replace(".", "")
        edata = der_seq(krb_padata(PA_ETYPE_INFO2, krb_etype_info2(salt)),
                        krb_padata(PA_ENC_TIMESTAMP, b""), krb_padata(PA_PK_AS_REQ, b""),
                        krb_padata(PA_PK_AS_REP_OLD, b""))
        return krb_error(KDC_ERR_PREAUTH_REQUIRED, self.abs(t), REALM, krb_principal(NT_SRV_INST, "krbtgt", REALM),
                         edata=edata)

    def krb_as_rep(self, user: str, tcp: bool) -> bytes:
        r = self.rng
        salt = REALM + user.replace(".", "")
        tl = r.randrange(1100, 1500) if tcp else r.randrange(700, 860)
        tgt = krb_ticket(REALM, krb_principal(NT_SRV_INST, "krbtgt", REALM), r.randbytes(tl))
        pad = [krb_padata(PA_ETYPE_INFO2, der_seq(der_seq(ctx(0, der_int(ETYPE_AES256)),
                                                          ctx(1, der_gstring(salt)))))]
        return krb_kdc_rep(KRB_AS_REP, REALM, krb_principal(NT_PRINCIPAL, user), tgt,
                           r.randbytes(r.randrange(250, 300)), pad)

    def krb_logon(self, t: int, cli: Host, *, tcp: bool | None = None, outcome: str = "ok",
                  services: list[tuple[str, str]] | None = None, kdc: Host | None = None,
                  user: str | None = None) -> int:
        r = self.rng
        kdc = kdc or (self.dc1 if r.random() < 0.6 else self.dc2)
        tcp = (r.random() < 0.35) if tcp is None else tcp
        user = user or ("svc_legacy" if outcome == "unknown" else self.user_for(cli))
        cname = krb_principal(NT_PRINCIPAL, user)
        tgt_sname = krb_principal(NT_SRV_INST, "krbtgt", REALM)
        think = lambda: r.randrange(150 * US, 900 * US)   # noqa: E731
        t = self.krb_xchg(t, cli, kdc, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), False),
                          (lambda tt: krb_error(KDC_ERR_C_PRINCIPAL_UNKNOWN, self.abs(tt), REALM, tgt_sname,
                                                cname=cname))
                          if outcome == "unknown" else (lambda tt: self.krb_preauth_required(user, tt)),
                          r.randrange(80 * US, 400 * US), tcp)
        if outcome == "unknown":
            return t
        t += think()
        if outcome == "badpw":
            salt = REALM + user.replace(".", "")
            return self.krb_xchg(
                t, cli, kdc, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True),
                lambda tt: krb_error(KDC_ERR_PREAUTH_FAILED, self.abs(tt), REALM, tgt_sname, cname=cname,
                                     edata=der_seq(krb_padata(PA_ETYPE_INFO2, krb_etype_info2(salt)))),
                r.randrange(1 * MS, 3 * MS), tcp)
        t = self.krb_xchg(t, cli, kdc, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True),
                          lambda tt: self.krb_as_rep(user, tcp), r.randrange(1 * MS, 4 * MS), tcp)
        if services is None:
            services = r.sample([("cifs", "fs01"), ("ldap", "dc01"), ("host", cli.name.lower()),
                                 ("HTTP", "intranet"), ("ldap", "dc02")], r.randrange(1, 4))
        tgt_len = r.randrange(1100, 1500) if tcp else r.randrange(700, 860)
        tgt = krb_ticket(REALM, tgt_sname, r.randbytes(tgt_len))
        for svc, host in services:
            t += think()
            sname = krb_principal(NT_SRV_INST, svc, f"{host}.{DOMAIN}")
            req = krb_kdc_req(KRB_TGS_REQ,
                              [krb_padata(PA_TGS_REQ, krb_ap_req(tgt, r.randbytes(r.randrange(160, 200))))],
                              krb_req_body(KDC_OPT_TGS, REALM, sname, r.randrange(1 << 24, 1 << 31),
                                           etypes=(ETYPE_AES256, ETYPE_AES128, ETYPE_RC4)))
            tl = r.randrange(1000, 1400) if tcp else r.randrange(650, 800)
            rep = krb_kdc_rep(KRB_TGS_REP, REALM, cname, krb_ticket(REALM, sname, r.randbytes(tl), SERVICE_KVNO),
                              r.randbytes(r.randrange(240, 300)))
            t = self.krb_xchg(t, cli, kdc, req, lambda tt, rep=rep: rep, r.randrange(500 * US, 2500 * US),
                              tcp)
        return t

    # -- LDAP -----------------------------------------------------------------------------------
    def ldap_user_entry(self, user: str) -> bytes:
        e = self._ldap_cache.get(("u", user))
        if e is None:           # one directory entry per user, built the first time it is read
            e = self._ldap_cache[("u", user)] = self._ldap_user_entry(user)
        return e

    def _ldap_user_entry(self, user: str) -> bytes:
        r = self.rng
        first, last = user.split(".")
        cn = f"{first.title()} {last.title()}"
        groups = r.sample(["eng", "finance", "hr", "sales", "vpn-users", "all-staff", "build", "wifi"],
                          r.randrange(1, 6))
        return ldap_search_entry(f"CN={cn},OU=Users,{LDAP_BASE}", [
            ("objectClass", ["top", "person", "organizationalPerson", "user"]), ("cn", [cn]),
            ("sAMAccountName", [user]), ("userPrincipalName", [f"{user}@{DOMAIN}"]),
            ("mail", [f"{user}@example.com"]), ("userAccountControl", ["512"]),
            ("memberOf", [f"CN={g},OU=Groups,{LDAP_BASE}" for g in groups]),
            ("objectGUID", [r.randbytes(16)])])

    def ldap_group_entry(self, name: str, members: int) -> bytes:
        e = self._ldap_cache.get(("g", name, members))
        if e is None:
            e = self._ldap_cache[("g", name, members)] = self._ldap_group_entry(name, members)
        return e

    def _ldap_group_entry(self, name: str, members: int) -> bytes:
        us = [self.users[i % len(self.users)] for i in range(members)]
        return ldap_search_entry(f"CN={name},OU=Groups,{LDAP_BASE}", [
            ("objectClass", ["top", "group"]), ("cn", [name]),
            ("member", [f"CN={u.split('.')[0].title()} {u.split('.')[1].title()},OU=Users,{LDAP_BASE}"
                        for u in us])])

    def ldap_computer_entry(self, h: Host) -> bytes:
        return ldap_search_entry(f"CN={h.name},OU=Workstations,{LDAP_BASE}", [
            ("objectClass", ["top", "computer"]), ("dNSHostName", [f"{h.name.lower()}.{DOMAIN}"]),
            ("operatingSystem", ["Windows 10 Enterprise"])])

    def ldap_op(self, L: Ldap, t: int, split_req: bool = False) -> int:
        r = self.rng
        x = r.random()
        if x < 0.45:
            u = r.choice(self.users)
            return L.search(t, LDAP_BASE, f_and(f_eq("objectClass", "user"), f_eq("sAMAccountName", u)),
                            ["cn", "mail", "memberOf", "userAccountControl"], [self.ldap_user_entry(u)],
                            split_req)
        if x < 0.6:
            g = r.choice(["eng", "finance", "all-staff", "vpn-users"])
            return L.search(t, f"OU=Groups,{LDAP_BASE}", f_and(f_eq("objectClass", "group"), f_substr("cn", g)),
                            ["member", "cn"], [self.ldap_group_entry(g, r.randrange(5, 120))], split_req)
        if x < 0.72:
            hs = r.sample(self.ws, r.randrange(2, 9))
            return L.search(t, f"OU=Workstations,{LDAP_BASE}",
                            f_and(f_eq("objectCategory", "computer"), f_substr("dNSHostName", "ws-1")),
                            ["dNSHostName", "operatingSystem"], [self.ldap_computer_entry(h) for h in hs],
                            split_req)
        if x < 0.8:
            a, b = r.sample(self.users, 2)
            return L.search(t, LDAP_BASE, f_or(f_eq("mail", a + "@example.com"), f_eq("mail", b + "@example.com")),
                            ["sAMAccountName"], [], split_req)
        if x < 0.87:
            return L.search(t, "", f_present("objectClass"), ["defaultNamingContext", "dnsHostName"],
                            [ldap_search_entry("", [("defaultNamingContext", [LDAP_BASE]),
                                                    ("dnsHostName", [f"dc01.{DOMAIN}"])])], split_req, SCOPE_BASE)
        u = r.choice(self.users)
        first, last = u.split(".")
        return L.modify(t, f"CN={first.title()} {last.title()},OU=Users,{LDAP_BASE}",
                        [(MOD_REPLACE, "telephoneNumber", [f"+1 555 {r.randrange(1000, 9999)}"]),
                         (MOD_REPLACE, "description", ["updated by synth"])])

    def ldap_session(self, t: int, cli: Host, n_ops: int, think: tuple[int, int]) -> int:
        r = self.rng
        L = Ldap(self, cli, self.dc1 if r.random() < 0.7 else self.dc2)
        t = L.c.open(t) + r.randrange(5 * US, 40 * US)
        dn = (f"CN=svc-{cli.name},OU=Service Accounts,{LDAP_BASE}" if not cli.windows
              else f"CN={cli.name},OU=Workstations,{LDAP_BASE}")
        t = L.bind(t, dn)
        for _ in range(n_ops):
            t = self.ldap_op(L, t + r.randrange(*think), split_req=r.random() < 0.08)
        return L.unbind_close(t + r.randrange(*think))

    # -- SMB2 -----------------------------------------------------------------------------------
    def smb_file_op(self, s: Smb, t: int) -> int:
        r = self.rng
        name = f"{r.choice(SHARE_DIRS)}\\{r.choice(FILE_NAMES)}"
        size = int(min(4 << 20, r.lognormvariate(9.2, 1.4)))
        x = r.random()
        oplock = OPLOCK_BATCH if x < 0.4 else OPLOCK_LEASE if x < 0.7 else OPLOCK_II if x < 0.8 else OPLOCK_NONE
        y = r.random()
        write = y >= 0.65 and y < 0.9
        t, f = s.open(t, name, size, oplock, write=write, disposition=FILE_OPEN if not write else FILE_OPEN_IF)
        t += r.randrange(15 * US, 200 * US)
        if y < 0.65:
            t = s.read(t, f, min(size, 4 << 20))
        elif write:
            t = s.write(t, f, max(1, min(size, 1 << 20)))
        return s.close(t + r.randrange(15 * US, 200 * US), f)

    def smb_session(self, t: int, cli: Host, n_ops: int, think: tuple[int, int],
                    logoff: bool | None = None) -> int:
        r = self.rng
        s = Smb(self, cli, self.fs, self.user_for(cli))
        t = s.setup(t)
        for _ in range(n_ops):
            t = self.smb_file_op(s, t + r.randrange(*think))
        if logoff if logoff is not None else r.random() < 0.5:
            t = s.logoff(t + r.randrange(*think))
        return t

    # -- HTTP -----------------------------------------------------------------------------------
    def http_session(self, t: int, cli: Host, srv: Host, port: int, n_req: int, think: tuple[int, int],
                     losses: bool = True, end: str | None = None) -> int:
        r = self.rng
        c = Tcp(self, cli, srv, port)
        t = c.open(t) + r.randrange(5 * US, 50 * US)
        host = f"{srv.name}.{DOMAIN}"
        for i in range(n_req):
            x = r.random()
            size = (r.randrange(200, 3000) if x < 0.65 else r.randrange(3000, 30000) if x < 0.92
                    else r.randrange(30000, 150000) if x < 0.995 else r.randrange(150000, 1 << 20))
            if r.random() < 0.85:
                req = (f"GET /api/v1/items/{r.randrange(100000)}?fields=all HTTP/1.1\r\nHost: {host}\r\n"
                       f"User-Agent: synth-client/1.0\r\nAccept: */*\r\n\r\n").encode()
            else:
                body = self.payload(r.randrange(100, 20000))
                req = (f"POST /api/v1/upload HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            status = "200 OK" if r.random() < 0.95 else "404 Not Found"
            if status != "200 OK":
                size = 0
            rsp = (f"HTTP/1.1 {status}\r\nServer: synth/1.0\r\nContent-Type: application/octet-stream\r\n"
                   f"Content-Length: {size}\r\n\r\n").encode() + (self.payload(size) if size else b"")
            nseg = (len(rsp) + c.mss - 1) // c.mss
            loss = None
            if losses:
                y = r.random()
                if cli.rtt > 5 * MS and y < 0.04:
                    loss = "rto"
                elif nseg >= 10 and y < 0.03:
                    loss = ("fast", r.randrange(1, nseg - 5))
            a = c.send(t, 0, req)
            t = c.send(a + r.randrange(150 * US, 6 * MS), 1, rsp, loss=loss)
            if i + 1 < n_req:
                t += r.randrange(*think)
        end = end or ("close" if r.random() < 0.75 else "server_close" if r.random() < 0.6 else "rst")
        if end == "rst":
            return c.abort(t + r.randrange(50 * US, 2 * MS), 0)
        if end == "server_close":
            return c.close(t + r.randrange(5 * SEC, 15 * SEC), 1)
        return c.close(t + r.randrange(20 * US, 5 * MS), 0)

    # -- misc -----------------------------------------------------------------------------------
    def syslog(self, t: int, h: Host, count: int = 1) -> int:
        r = self.rng
        p = Path(h, self.log, r.randrange(32768, 60999), SYSLOG_PORT, PROTO_UDP, r.getrandbits(16))
        for _ in range(count):
            stamp = time.strftime("%b %d %H:%M:%S", time.gmtime(self.abs(t) // SEC))
            app_, pid = r.choice([("sshd", 811), ("cron", 1202), ("app", 4410), ("kernel", 0), ("nginx", 990)])
            text = r.choice(["session opened for user deploy", "connection from 10.2.0.7 closed",
                             "request completed in 12 ms", "disk usage at 71%", "config reloaded",
                             "worker 3 restarted", "health check ok"])
            msg = f"<{r.choice([13, 14, 30, 38, 86, 134])}>{stamp} {h.name} {app_}[{pid}]: {text}"
            self.store.udp(t, p, msg.encode())
            t += r.randrange(50 * US, 20 * MS)
        return t

    def refused(self, t: int, cli: Host) -> int:
        srv = self.rng.choice(self.apps)
        c = Tcp(self, cli, srv, self.rng.choice([9000, 3389, 5432]))
        return c.refuse(t)


    def smb_break_demo(self, t: int, h1: Host, h2: Host, lease: bool) -> int:
        """h1 holds a batch oplock / RWH lease; h2's open breaks it quickly (STATUS_PENDING meanwhile)."""
        r = self.rng
        name = "finance\\ledger.xlsx" if lease else "eng\\docs\\spec.docx"
        s1 = Smb(self, h1, self.fs, self.user_for(h1))
        t1 = s1.setup(t)
        t1, f1 = s1.open(t1 + r.randrange(20 * US, 90 * US), name, 20_000,
                         OPLOCK_LEASE if lease else OPLOCK_BATCH, LEASE_R | LEASE_W | LEASE_H)
        t1 = s1.read(t1 + r.randrange(20 * US, 90 * US), f1)
        s2 = Smb(self, h2, self.fs, self.user_for(h2))
        t2 = s2.setup(t + 30 * MS)
        tc = max(t1, t2) + r.randrange(2 * MS, 8 * MS)
        a, mid, key = s2.create_req(tc, name, OPLOCK_LEASE if lease else OPLOCK_BATCH,
                                    LEASE_R | LEASE_H if lease else 0)
        aid = s2.async_next
        s2.async_next += 1
        s2.rsp(a + r.randrange(30 * US, 70 * US), SMB2_CREATE, mid, smb2_error_body(), ST_PENDING,
               async_id=aid)
        tb = a + r.randrange(50 * US, 120 * US)
        if lease:
            react = s1.push(tb, SMB2_OPLOCK_BREAK, smb2_lease_break_notify(
                f1.lease_key, LEASE_R | LEASE_W | LEASE_H, LEASE_R | LEASE_H, 1))
            body = smb2_lease_break_ack(f1.lease_key, LEASE_R | LEASE_H)
        else:
            react = s1.push(tb, SMB2_OPLOCK_BREAK, smb2_oplock_break(OPLOCK_II, f1.fid), s1.sess)
            body = smb2_oplock_break(OPLOCK_II, f1.fid)
        a2, mid2 = s1.req(react + r.randrange(200 * US, 900 * US), SMB2_OPLOCK_BREAK, body)
        s1.rsp(a2 + r.randrange(30 * US, 90 * US), SMB2_OPLOCK_BREAK, mid2, body)
        t2, f2 = s2.create_rsp(a2 + r.randrange(100 * US, 250 * US), mid, name,
                               OPLOCK_LEASE if lease else OPLOCK_II, key, LEASE_R | LEASE_H, 20_000,
                               async_id=aid)
        t2 = s2.read(t2 + r.randrange(20 * US, 90 * US), f2)
        t2 = s2.close(t2 + r.randrange(20 * US, 90 * US), f2)
        s1.close(a2 + r.randrange(5 * MS, 50 * MS), f1)
        return t2

