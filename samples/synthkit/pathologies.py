"""The labelled pathologies: each builder writes one episode into the store and one label (see
``LABEL_KEYS`` in :mod:`.base`): a DNS TTL-expiry herd, a DNS retry storm, a Kerberos AS herd, an
SMB2 lease-break queue, a TCP RTO stall on a LAN path, LDAP connection churn and an SMB2
check-then-use (TOCTOU) window."""
from __future__ import annotations

from .base import DOMAIN, MS, REALM, SEC, US
from .dns import T_A
from .sessions import LDAP_PORT, SMB_PORT, Ldap, Smb
from .site import LDAP_BASE, Zone
from .tcp import Tcp
from .traffic import DNS_PORT, KRB_PORT
from .ldap import f_and, f_eq
from .smb2 import (FILE_OVERWRITE_IF, LEASE_H, LEASE_R, LEASE_W, OPLOCK_BATCH, OPLOCK_LEASE, OPLOCK_NONE,
                   SMB2_CREATE, SMB2_OPLOCK_BREAK, ST_PENDING, smb2_error_body, smb2_lease_break_ack,
                   smb2_lease_break_notify)


STALL_PORT = 8080                # the HTTP service whose response tail is lost (patho_tcp_stall)


class Pathologies:
    """The labelled episodes; mixed into :class:`.generator.Gen` (needs :class:`.site.Site` and
    :class:`.traffic.Traffic`)."""

    def patho_dns_herd(self, T: int) -> None:
        r = self.rng
        n = self.n(400, 12)
        ttl = 10
        name = self.herd_name
        self.zone[name] = Zone(name, ["10.0.2.50"], [], ttl)
        # the answer everybody cached: primed ttl seconds before the herd
        primer = r.choice(self.lnx)
        t_prime = T - ttl * SEC
        self.dns_udp(t_prime, primer, name, (T_A,), slow=False)
        clients = r.sample(self.ws[:1200] + self.lnx[:200], n)
        window = 4 * MS
        arrivals = sorted(T + int(window * r.random() ** 2) + r.randrange(0, 200 * US) for _ in clients)
        # the resolver coalesces: one upstream refresh, then answers in a burst
        upstream_done = arrivals[0] + r.randrange(8 * MS, 15 * MS)
        busy = 0
        first, last = arrivals[0], 0
        for cli, ta in zip(clients, arrivals):
            q, a = self.udp_pair(cli, self.dns, r.randrange(49152, 65536), DNS_PORT)
            txid = r.getrandbits(16)
            edns = r.random() < 0.5
            self.store.udp(ta, q, self.dns_query(txid, name, T_A, edns))
            busy = max(busy, upstream_done, ta) + r.randrange(6 * US, 14 * US)
            self.store.udp(busy, a, self.dns_answer(txid, name, T_A, edns, ttl))
            last = busy
        self.label("herd", first, last, [c.ip for c in clients], self.dns, DNS_PORT, "dns", name,
                   f"{n} clients query {name} within {(arrivals[-1] - first) / MS:.1f} ms after the "
                   f"{ttl} s TTL of the answer they all cached expired",
                   ttl_s=ttl, primed_ns=t_prime, expiry_ns=T, n_clients=n, qtype="A",
                   query_window_ms=round((arrivals[-1] - first) / MS, 3),
                   episode_ms=round((last - first) / MS, 3))

    def patho_retry_storm(self, T: int) -> None:
        r = self.rng
        n = self.n(150, 8)
        attempts = 5
        name = self.storm_name
        clients = r.sample(self.ws[1200:] + self.lnx[200:], n)
        first, last = None, 0
        for cli in clients:
            q, _ = self.udp_pair(cli, self.dns, r.randrange(49152, 65536), DNS_PORT)
            txid = r.getrandbits(16)
            edns = not cli.windows
            t = T + r.randrange(0, 400 * MS)
            payload = self.dns_query(txid, name, T_A, edns)
            for k in range(attempts):
                tk = t + k * SEC + r.randrange(0, 3 * MS)
                self.store.udp(tk, q, payload)
                first = tk if first is None else min(first, tk)
                last = max(last, tk)
        self.label("retry_storm", first, last, [c.ip for c in clients], self.dns, DNS_PORT, "dns", name,
                   f"{n} clients retry an unanswered query for {name} every 1 s ({attempts} attempts each)",
                   retry_interval_s=1.0, attempts=attempts, n_clients=n, answered=False, qtype="A")

    def patho_krb_herd(self, T: int) -> None:
        r = self.rng
        n = self.n(300, 10)
        kdc = self.dc1
        clients = r.sample(self.ws, n)
        arrivals = sorted(T + int(5 * MS * r.random() ** 1.5) for _ in clients)
        q_busy = 0
        workers = [0, 0, 0, 0]
        first, last = arrivals[0], 0
        for cli, ta in zip(clients, arrivals):
            user = self.user_for(cli)
            q, a = self.udp_pair(cli, kdc, cli.ephemeral(), KRB_PORT)
            self.store.udp(ta, q, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), False))
            q_busy = max(q_busy, ta) + r.randrange(40 * US, 90 * US)
            self.store.udp(q_busy, a, self.krb_preauth_required(user, q_busy))
            t2 = q_busy + cli.rtt + r.randrange(200 * US, 700 * US)
            q2, a2 = self.udp_pair(cli, kdc, cli.ephemeral(), KRB_PORT)
            self.store.udp(t2, q2, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True))
            workers.sort()
            done = max(workers[0], t2) + r.randrange(600 * US, 1400 * US)
            workers[0] = done
            self.store.udp(done, a2, self.krb_as_rep(user, False))
            last = max(last, done)
        self.label("herd", first, last, [c.ip for c in clients], kdc, KRB_PORT, "kerberos", f"krbtgt/{REALM}",
                   f"{n} workstations send AS-REQs to {kdc.name} within {(arrivals[-1] - first) / MS:.1f} ms",
                   n_clients=n, request_window_ms=round((arrivals[-1] - first) / MS, 3),
                   msg_type="AS-REQ", realm=REALM, kdc_workers=len(workers))

    def patho_lease_break_queue(self, T: int) -> None:
        r = self.rng
        k = self.n(8, 3)
        holder_h, *waiter_hs = r.sample(self.ws, k + 1)
        path = "q1\\forecast.xlsx"
        holder = Smb(self, holder_h, self.fs, self.user_for(holder_h))
        t = holder.setup(T - 8 * SEC - r.randrange(0, SEC))
        big = self.scale >= 0.1
        t, f = holder.open(t + 2 * MS, path, 420_000, OPLOCK_LEASE, LEASE_R | LEASE_W | LEASE_H, write=True)
        t = holder.write(t + 3 * MS, f, 131072 if big else 16384)    # dirty data cached under the W lease
        waiters = []
        for h in waiter_hs:
            w = Smb(self, h, self.fs, self.user_for(h))
            w.setup(T - r.randrange(1 * SEC, 6 * SEC))
            waiters.append(w)
        arrivals = sorted(T + r.randrange(0, 60 * MS) for _ in waiters)
        pending = []
        for w, ta in zip(waiters, arrivals):
            a, mid, key = w.create_req(ta, path, OPLOCK_LEASE, LEASE_R | LEASE_H, write=True)
            aid = w.async_next
            w.async_next += 1
            w.rsp(a + r.randrange(30 * US, 80 * US), SMB2_CREATE, mid, smb2_error_body(), ST_PENDING,
                  async_id=aid)
            pending.append((w, mid, key, aid))
        t_break = arrivals[0] + r.randrange(60 * US, 150 * US)
        t_cli = holder.push(t_break, SMB2_OPLOCK_BREAK,
                            smb2_lease_break_notify(f.lease_key, LEASE_R | LEASE_W | LEASE_H, LEASE_R | LEASE_H, 1))
        delay = r.randrange(700 * MS, 1400 * MS)
        t = holder.write(t_cli + delay, f, 262144 if big else 32768)      # flush before acknowledging
        a, mid = holder.req(t + r.randrange(50 * US, 200 * US), SMB2_OPLOCK_BREAK,
                            smb2_lease_break_ack(f.lease_key, LEASE_R | LEASE_H))
        t_ack = a - holder.c.near
        holder.rsp(a + r.randrange(40 * US, 120 * US), SMB2_OPLOCK_BREAK, mid,
                   smb2_lease_break_ack(f.lease_key, LEASE_R | LEASE_H))
        tf = a + r.randrange(150 * US, 300 * US)
        last = 0
        for w, mid, key, aid in pending:
            w_t, wf = w.create_rsp(tf, mid, path, OPLOCK_LEASE, key, LEASE_R, 420_000 + 262144, async_id=aid)
            last = tf
            tf += r.randrange(30 * US, 90 * US)
            tt = w.read(w_t + r.randrange(20 * US, 200 * US), wf, 65536 if big else 8192)
            w.close(tt + r.randrange(20 * US, 200 * US), wf)
        holder.close(t_ack + r.randrange(2 * SEC, 4 * SEC), f)
        self.label("smb_break_queue", arrivals[0], last, [w.cli.ip for w in waiters], self.fs, SMB_PORT, "smb2",
                   f"\\\\fs01.{DOMAIN}\\projects\\{path}",
                   f"{k} CREATEs wait (STATUS_PENDING) behind a lease break that {holder_h.ip} acknowledges "
                   f"{(t_ack - t_break) / MS:.0f} ms late",
                   holder=holder_h.ip, break_notify_ns=t_break, break_ack_ns=t_ack,
                   ack_delay_ms=round((t_ack - t_break) / MS, 3), waiters=k,
                   lease_state_from="RWH", lease_state_to="RH")

    def patho_tcp_stall(self, T: int) -> None:
        r = self.rng
        cli = r.choice(self.lnx)
        srv = self.apps[0]
        c = Tcp(self, cli, srv, STALL_PORT)
        t = c.open(T - 300 * MS)
        host = f"{srv.name}.{DOMAIN}"

        def exchange(t, size, loss=None):
            req = (f"GET /api/v1/report/{r.randrange(10000)} HTTP/1.1\r\nHost: {host}\r\n"
                   f"User-Agent: synth-client/1.0\r\n\r\n").encode()
            rsp = (f"HTTP/1.1 200 OK\r\nServer: synth/1.0\r\nContent-Type: application/octet-stream\r\n"
                   f"Content-Length: {size}\r\n\r\n").encode() + self.payload(size)
            a = c.send(t, 0, req)
            return c.send(a + r.randrange(100 * US, 400 * US), 1, rsp, loss=loss)

        while t < T - 60 * MS:          # a few quick exchanges establish the µs RTT
            t = exchange(t, r.randrange(1000, 12000)) + r.randrange(20 * MS, 60 * MS)
        rsp_size = 20000
        t_end = exchange(T, rsp_size, loss="rto")
        orig_t, retx_t = c.last_loss
        t = t_end + r.randrange(1 * MS, 20 * MS)
        for _ in range(3):
            t = exchange(t, r.randrange(1000, 12000)) + r.randrange(5 * MS, 60 * MS)
        c.close(t, 0)
        self.label("tcp_stall", orig_t, retx_t, [cli.ip], srv, STALL_PORT, "tcp",
                   f"{cli.ip}:{c.sport}->{srv.ip}:{STALL_PORT}",
                   f"tail segment of a response lost; retransmitted after an RTO of "
                   f"{(retx_t - orig_t) / MS:.0f} ms on a path with {c.rtt / US:.0f} us RTT",
                   gap_ms=round((retx_t - orig_t) / MS, 3), rtt_us=round(c.rtt / US, 1),
                   original_ns=orig_t, retransmission_ns=retx_t, direction="server->client",
                   client_port=c.sport, retransmissions=1)

    def patho_ldap_churn(self, T: int) -> None:
        r = self.rng
        n = self.n(300, 10)
        cli = self.lnx[7]
        srv = self.dc1
        rate = 80.0
        t = T
        first = T
        last = T
        lifetimes = []
        for _ in range(n):
            L = Ldap(self, cli, srv)
            t0 = t
            tt = L.c.open(t) + r.randrange(5 * US, 30 * US)
            tt = L.bind(tt, f"CN=svc-{cli.name},OU=Service Accounts,{LDAP_BASE}")
            u = r.choice(self.users)
            tt = L.search(tt + r.randrange(5 * US, 30 * US), LDAP_BASE,
                          f_and(f_eq("objectClass", "user"), f_eq("sAMAccountName", u)),
                          ["cn", "mail", "memberOf"], [self.ldap_user_entry(u)])
            tt = L.unbind_close(tt + r.randrange(5 * US, 30 * US))
            lifetimes.append(tt - t0)
            last = max(last, tt)
            t += int(r.expovariate(rate) * SEC) + 200 * US
        self.label("conn_churn", first, last, [cli.ip], srv, LDAP_PORT, "ldap", f"ldap://dc01.{DOMAIN}",
                   f"{cli.ip} opens a new LDAP connection (connect, bind, one search, unbind) for each of "
                   f"{n} operations",
                   connections=n, rate_per_s=rate, ops_per_connection=1,
                   mean_lifetime_ms=round(sum(lifetimes) / n / MS, 3))

    def patho_toctou(self, T: int) -> None:
        r = self.rng
        a_h, b_h = r.sample(self.ws, 2)
        path = "scripts\\deploy.ps1"
        A = Smb(self, a_h, self.fs, self.user_for(a_h), "it")
        B = Smb(self, b_h, self.fs, self.user_for(b_h), "it")
        A.setup(T - 3 * SEC)
        B.setup(T - 2 * SEC)
        # A checks (open for attributes, close with post-query attributes) ...
        t, fa = A.open(T, path, 5120, OPLOCK_NONE)
        t = A.close(t + r.randrange(50 * US, 300 * US), fa, postquery=True)
        check_end = t
        # ... B replaces the file ...
        tb = t + r.randrange(2 * MS, 6 * MS)
        t2, fb = B.open(tb, path, 0, OPLOCK_NONE, write=True, disposition=FILE_OVERWRITE_IF)
        t2 = B.write(t2 + r.randrange(30 * US, 200 * US), fb, 7300)
        t2 = B.close(t2 + r.randrange(30 * US, 200 * US), fb)
        # ... then A uses what it checked
        tu = t2 + r.randrange(1 * MS, 4 * MS)
        mark = len(self.store)
        t3, fa2 = A.open(tu, path, 7300, OPLOCK_BATCH)
        use_rsp = max(self.store.ts[mark:])
        t3 = A.read(t3 + r.randrange(30 * US, 200 * US), fa2)
        A.close(t3 + r.randrange(30 * US, 200 * US), fa2)
        self.label("toctou", T, use_rsp, [a_h.ip, b_h.ip], self.fs, SMB_PORT, "smb2",
                   f"\\\\fs01.{DOMAIN}\\it\\{path}",
                   f"{a_h.ip} checks {path}, {b_h.ip} overwrites it, then {a_h.ip} opens it for use",
                   checker=a_h.ip, modifier=b_h.ip, check_ns=T, check_done_ns=check_end, modify_ns=tb,
                   use_ns=tu, window_ms=round((tu - T) / MS, 3))

