"""The generator: :class:`Gen` puts the site (:class:`.site.Site`), its normal sessions
(:class:`.traffic.Traffic`) and the labelled episodes (:class:`.pathologies.Pathologies`) together
and schedules them (scenario scheduling): the pathologies at fixed fractions of the capture, a
showcase of every normal feature, then random sessions drawn from :data:`Gen.MIX` until the
capture has exactly the asked number of packets."""
from __future__ import annotations

import bisect

from .base import DOMAIN, MS, SEC, US
from .dns import T_A, T_AAAA
from .ldap import f_and, f_eq, f_substr
from .pathologies import Pathologies
from .sessions import Ldap, Smb
from .site import LDAP_BASE, Site
from .smb2 import FILE_OVERWRITE_IF, OPLOCK_BATCH, OPLOCK_LEASE
from .tcp import Tcp
from .traffic import Traffic

SMALL_SESSION_PACKETS = 40      # below this many packets left to fill, only single DNS lookups are drawn
MAX_MISSES = 20                 # after this many sessions that overshot the count, likewise


class Gen(Pathologies, Traffic, Site):
    """Builds the whole capture into a :class:`.frames.Store` plus labels."""

    def showcase(self, t: int) -> None:
        """One of every normal feature, so that even small captures contain them all."""
        ws, lnx = self.ws, self.lnx
        self.dns_udp(t, lnx[0], f"www.{DOMAIN}", (T_A, T_AAAA), slow=False)      # CNAME chain
        self.dns_udp(t + 2 * MS, ws[0], "wpad." + DOMAIN, (T_A,))                 # NXDOMAIN + SOA
        self.dns_udp(t + 4 * MS, self.v6[0], f"web01.{DOMAIN}", (T_AAAA, T_A))    # over IPv6
        self.dns_udp(t + 6 * MS, lnx[1], "www.example.com", (T_A,), slow=True)
        self.dns_tc_fallback(t + 9 * MS, lnx[2])                                  # DNS over TCP
        self.krb_logon(t + 20 * MS, ws[1], tcp=False)
        self.krb_logon(t + 40 * MS, ws[2], tcp=True)
        self.krb_logon(t + 60 * MS, ws[3], tcp=False, outcome="unknown")          # KRB-ERROR 6
        self.krb_logon(t + 80 * MS, ws[4], tcp=False, outcome="badpw")            # KRB-ERROR 24
        self.krb_logon(t + 90 * MS, ws[9], tcp=True, outcome="badpw")
        # LDAP: split request, several messages per segment, multi-segment entry, modify
        L = Ldap(self, lnx[3], self.dc1)
        tl = L.bind(L.c.open(t + 100 * MS) + 20 * US, f"CN=svc-{lnx[3].name},OU=Service Accounts,{LDAP_BASE}")
        u = self.users[5]
        tl = L.search(tl + 50 * US, LDAP_BASE, f_and(f_eq("objectClass", "user"), f_eq("sAMAccountName", u)),
                      ["cn", "mail"], [self.ldap_user_entry(u)], split_req=True)
        tl = L.search(tl + 2 * MS, f"OU=Workstations,{LDAP_BASE}",
                      f_and(f_eq("objectCategory", "computer"), f_substr("dNSHostName", "ws-1")),
                      ["dNSHostName"], [self.ldap_computer_entry(h) for h in ws[10:16]])
        tl = L.search(tl + 2 * MS, f"OU=Groups,{LDAP_BASE}", f_substr("cn", "all-staff"), ["member"],
                      [self.ldap_group_entry("all-staff", 60)])
        tl = L.modify(tl + 3 * MS, f"CN=Anna Adams,OU=Users,{LDAP_BASE}", [(2, "description", ["on leave"])])
        L.unbind_close(tl + 5 * MS)
        # SMB2: plain session, oplock break, lease break (both with STATUS_PENDING + async final)
        s = Smb(self, ws[20], self.fs, self.user_for(ws[20]))
        ts = s.setup(t + 150 * MS)
        ts, f = s.open(ts + 100 * US, "eng\\src\\main.c", 12000, OPLOCK_BATCH)
        ts = s.close(s.read(ts + 50 * US, f) + 50 * US, f)
        ts, f = s.open(ts + 2 * MS, "eng\\src\\build.log", 0, OPLOCK_LEASE, write=True, disposition=FILE_OVERWRITE_IF)
        ts = s.close(s.write(ts + 50 * US, f, 9000) + 50 * US, f)
        s.logoff(ts + 3 * MS)
        self.smb_break_demo(t + 200 * MS, ws[21], ws[22], lease=False)
        self.smb_break_demo(t + 350 * MS, ws[23], ws[24], lease=True)
        # TCP: RTO on a WAN path, fast retransmit, zero window, RST abort, refused connection
        c = Tcp(self, self.wan[0], self.web, 80)
        tc = c.open(t + 500 * MS)
        req = f"GET /index.html HTTP/1.1\r\nHost: web01.{DOMAIN}\r\n\r\n".encode()
        rsp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 6000\r\n\r\n" \
            + self.payload(6000)
        tc = c.send(c.send(tc, 0, req) + 300 * US, 1, rsp, loss="rto")
        c.close(tc + 2 * MS, 0)
        c = Tcp(self, lnx[4], self.apps[1], 8080)
        tc = c.open(t + 520 * MS)
        rsp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 40000\r\n\r\n" \
            + self.payload(40000)
        tc = c.send(c.send(tc, 0, req) + 200 * US, 1, rsp, loss=("fast", 8))
        c.close(tc + 1 * MS, 0)
        c = Tcp(self, lnx[5], self.apps[2], 8080)
        tc = c.open(t + 540 * MS)
        rsp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 14504\r\n\r\n"
        tc = c.send(tc, 0, req)
        c.send(tc + 200 * US, 1, rsp, split=[len(rsp)])
        tc = c.zero_window(tc + 400 * US)
        c.close(tc + 1 * MS, 0)
        self.http_session(t + 560 * MS, ws[30], self.apps[3], 8080, 2, (1 * MS, 5 * MS), losses=False, end="rst")
        self.http_session(t + 580 * MS, self.v6[1], self.web6, 80, 2, (1 * MS, 5 * MS), losses=False)
        self.refused(t + 600 * MS, ws[31])
        self.syslog(t + 610 * MS, lnx[6], 3)

    # session kind -> probability per draw; tuned so that packets split roughly as HTTP 8080 30%,
    # SMB2 25%, DNS 12%, LDAP 10%, HTTP 80 8%, Kerberos 6%, syslog 2% (see tests/test_synth.py)
    MIX = (("dns", 0.700), ("http", 0.031), ("http_wan", 0.009), ("smb", 0.0076), ("ldap", 0.027),
           ("krb", 0.060), ("syslog", 0.160), ("dns_tcp", 0.001), ("refused", 0.003))

    def random_session(self, t: int, small: bool = False) -> None:
        r = self.rng
        kind = "dns" if small else self._pick()
        if kind == "dns":
            pool = self.v6 if r.random() < 0.08 else self.ws if r.random() < 0.6 else self.lnx
            self.dns_udp(t, r.choice(pool))
        elif kind == "http":
            self.http_session(t, r.choice(self.lnx if r.random() < 0.7 else self.ws), r.choice(self.apps),
                              8080, r.randrange(1, 13), (1 * MS, 800 * MS))
        elif kind == "http_wan":
            if r.random() < 0.15:
                self.http_session(t, r.choice(self.v6), self.web6, 80, r.randrange(1, 10), (5 * MS, 2 * SEC))
            else:
                self.http_session(t, r.choice(self.wan), self.web, 80, r.randrange(1, 12), (5 * MS, 2 * SEC))
        elif kind == "smb":
            self.smb_session(t, r.choice(self.ws), r.randrange(1, 30), (2 * MS, 3 * SEC))
        elif kind == "ldap":
            cli = r.choice(self.lnx if r.random() < 0.6 else self.ws)
            if cli.windows:
                self.ldap_session(t, cli, r.randrange(1, 4), (100 * US, 20 * MS))
            else:
                self.ldap_session(t, cli, r.randrange(5, 40), (1 * MS, 1500 * MS))
        elif kind == "krb":
            y = r.random()
            self.krb_logon(t, r.choice(self.ws), outcome="unknown" if y < 0.03 else "badpw" if y < 0.06 else "ok")
        elif kind == "syslog":
            self.syslog(t, r.choice(self.lnx), r.randrange(1, 5))
        elif kind == "dns_tcp":
            self.dns_tc_fallback(t, r.choice(self.lnx))
        else:
            self.refused(t, r.choice(self.ws + self.lnx))

    def _pick(self) -> str:
        if not hasattr(self, "_mix_cum"):
            acc, self._mix_cum = 0.0, []
            for _, p in self.MIX:
                acc += p
                self._mix_cum.append(acc)
        i = bisect.bisect_right(self._mix_cum, self.rng.random() * self._mix_cum[-1])
        return self.MIX[min(i, len(self.MIX) - 1)][0]

    # ============================================================================================
    # The whole capture
    # ============================================================================================
    def build(self) -> None:
        D, r, st = self.duration, self.rng, self.store
        at = lambda f: int(D * f)   # noqa: E731
        self.patho_dns_herd(max(at(0.42), 11 * SEC))
        self.patho_retry_storm(at(0.53))
        self.patho_krb_herd(at(0.70))
        self.patho_lease_break_queue(at(0.77))
        self.patho_tcp_stall(at(0.85))
        self.patho_ldap_churn(at(0.88))
        self.patho_toctou(at(0.95))
        self.showcase(500 * MS)
        if len(st) > self.packets:
            raise ValueError(f"--packets {self.packets} is too small for the pathologies and the protocol "
                             f"showcase ({len(st)} packets); use at least {len(st)}")
        misses = 0
        while len(st) < self.packets:
            rem = self.packets - len(st)
            t = r.randrange(0, D)
            if rem == 1:
                self.syslog(t, r.choice(self.lnx), 1)
                break
            mark = len(st)
            self.random_session(t, small=misses >= MAX_MISSES or rem < SMALL_SESSION_PACKETS)
            if len(st) > self.packets:
                st.rollback(mark)
                misses += 1
        assert len(st) == self.packets, (len(st), self.packets)
        self.labels.sort(key=lambda l: (l["start_ns"], l["detector"]))

