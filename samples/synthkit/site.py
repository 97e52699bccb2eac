"""The site a capture is taken at: its hosts, its DNS zone and users, the random stream, the packet
store and the labels (the state every traffic and pathology builder of :class:`.generator.Gen`
shares)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .base import BASE_EPOCH_NS, DETECTORS, DOMAIN, MIN_PACKETS, MS, SEC, US
from .frames import PROTO_UDP, Host, Path, Store

FIRST = ["anna", "ben", "carla", "dev", "emma", "farid", "gina", "hugo", "ines", "jon", "kai", "lena",
         "mario", "nina", "omar", "paula", "quinn", "rosa", "sam", "tara", "umar", "vera", "will", "yara"]
LAST = ["adams", "berg", "costa", "diaz", "evans", "fischer", "garcia", "hall", "ito", "jensen", "khan",
        "lopez", "meyer", "novak", "olsen", "patel", "quist", "rossi", "smith", "tanaka", "weber", "young"]
SHARE_DIRS = ["finance", "hr", "eng\\src", "eng\\docs", "sales", "q1", "q2", "scripts"]
FILE_NAMES = ["report.docx", "budget.xlsx", "notes.txt", "design.pdf", "main.c", "build.log", "data.csv",
              "slides.pptx", "setup.ps1", "readme.md", "archive.zip", "image.png"]
LDAP_BASE = "DC=corp,DC=example,DC=com"


@dataclass
class Zone:
    name: str
    v4: list[str]
    v6: list[str]
    ttl: int
    cname: str | None = None
    nx: bool = False
    remote: bool = False       # answered after recursion (slow) on a cache miss


PAYLOAD_POOL = 1 << 22          # bytes of random payload every data segment is a slice of
FIRST_SESSION_ID = 0x0000_1000_0000_0041     # SMB2 SessionIds as Windows servers hand them out ...
SESSION_ID_STEP = 0x1_0000_0009              # ... and the step between two sessions
KNUTH_HASH = 2654435761         # multiplicative hash (Knuth, TAOCP 6.4) that gives a host its user
FULL_SCALE_PACKETS = 1_000_000  # the capture size the pathology sizes (Site.n) are stated at
PACKETS_PER_SECOND = 8000       # the capture spans packets / this many seconds (at least 30 s)


class Site:
    """The site's hosts, zone, users and the shared state; see :class:`.generator.Gen`."""

    # Loss hook (samples/synth_scenarios.py): the share of TCP connections whose first SYN, or whose
    # first server tail segment, is lost after the capture point (resent after the initial RTO /
    # an RTO). 0, the default, draws nothing and changes nothing.
    syn_loss_share = 0.0
    tail_loss_share = 0.0
    loss_rng: random.Random | None = None
    losses: list | None = None          # (kind, client, client port, server, server port, time)

    def __init__(self, seed: int, packets: int):
        if packets < MIN_PACKETS:
            raise ValueError(f"--packets must be at least {MIN_PACKETS} (got {packets})")
        self.rng = r = random.Random(seed)
        self.seed, self.packets = seed, packets
        self.store = Store()
        self.labels: list[dict] = []
        self.duration = max(30 * SEC, packets * SEC // PACKETS_PER_SECOND)
        self.scale = min(1.0, packets / FULL_SCALE_PACKETS)
        self.pool = r.randbytes(PAYLOAD_POOL)
        self.fs_guid = r.randbytes(16)
        self._sess_id = FIRST_SESSION_ID + (r.getrandbits(16) << 8)

        def server(ip, windows=False, name=""):
            return Host(ip, windows=windows, local=True, rtt=20 * US, port=49152, name=name)

        self.dns = server("10.0.0.53", name="ns1")
        self.dns6 = server("fd00::53", name="ns1")
        self.dc1 = server("10.0.0.10", True, "DC01")
        self.dc2 = server("10.0.0.11", True, "DC02")
        self.fs = server("10.0.1.20", True, "FS01")
        self.apps = [server(f"10.0.2.{11 + i}", name=f"app{i + 1:02d}") for i in range(8)]
        self.web = server("10.0.2.30", name="web01")
        self.web6 = server("fd00::80", name="web01")
        self.log = server("10.0.3.5", name="log01")

        def client(ip, windows, lo, hi, name=""):
            return Host(ip, windows=windows, local=False, rtt=r.randrange(lo, hi),
                        port=r.randrange(49152, 60000) if windows else r.randrange(32768, 55000),
                        name=name)

        self.ws = [client(f"10.1.{1 + i // 250}.{1 + i % 250}", True, 60 * US, 400 * US,
                          f"WS-{1000 + i}") for i in range(2400)]
        self.lnx = [client(f"10.2.{i // 250}.{1 + i % 250}", False, 30 * US, 150 * US, f"lnx{i:03d}")
                    for i in range(300)]
        self.wan = [client(f"172.20.{i // 200}.{1 + i % 200}", r.random() < 0.6, 12 * MS, 45 * MS)
                    for i in range(500)]
        self.v6 = [client(f"fd00:1::{0x100 + i:x}", False, 40 * US, 200 * US) for i in range(200)]
        self.users = [f"{f}.{l}" for f in FIRST for l in LAST]
        self.zone = self._make_zone()
        self._names = self.lookup_names()
        self._ldap_cache: dict[tuple, bytes] = {}
        self.herd_name = "config.svc." + DOMAIN
        self.storm_name = "api.partner-broken.example"

    # -- helpers --------------------------------------------------------------------------------
    def abs(self, t: int) -> int:
        return BASE_EPOCH_NS + t

    def payload(self, n: int) -> bytes:
        o = self.rng.randrange(0, len(self.pool) - n)
        return self.pool[o:o + n]

    def next_session_id(self) -> int:
        self._sess_id += SESSION_ID_STEP
        return self._sess_id

    def user_for(self, h: Host) -> str:
        return self.users[(int.from_bytes(h.addr[-2:], "big") * KNUTH_HASH >> 7) % len(self.users)]

    def udp_pair(self, a: Host, b: Host, sport: int, dport: int) -> tuple[Path, Path]:
        r = self.rng
        return (Path(a, b, sport, dport, PROTO_UDP, r.getrandbits(16)),
                Path(b, a, dport, sport, PROTO_UDP, r.getrandbits(16)))

    def label(self, detector: str, start: int, end: int, clients: list[str], server: Host, port: int,
              protocol: str, resource: str, description: str, **parameters) -> None:
        assert detector in DETECTORS
        self.labels.append(dict(detector=detector, start_ns=start, end_ns=end, clients=clients,
                                server=server.ip, server_port=port, protocol=protocol,
                                resource=resource, description=description, parameters=parameters))

    def n(self, full: int, least: int) -> int:
        """Pathology size: ``full`` at 1M packets, shrinking with sqrt(scale), at least ``least``."""
        return max(least, round(full * math.sqrt(self.scale)))

    def _make_zone(self) -> dict[str, Zone]:
        r = self.rng
        z: dict[str, Zone] = {}

        def add(name, v4=(), v6=(), ttl=300, **kw):
            z[name] = Zone(name, list(v4), list(v6), ttl, **kw)

        for h in ["fs01", "dc01", "dc02", "mail", "intranet", "wiki", "git", "jira", "build", "print01",
                  "vpn", "proxy", "sso", "metrics", "grafana", "nexus", "ci", "backup"]:
            add(f"{h}.{DOMAIN}", [f"10.0.{r.randrange(0, 4)}.{r.randrange(2, 250)}"],
                [f"fd00::{r.randrange(0x100, 0xfff):x}"] if r.random() < 0.4 else [], ttl=1200)
        for i in range(8):
            add(f"app{i + 1:02d}.{DOMAIN}", [f"10.0.2.{11 + i}"], ttl=300)
        add(f"www.{DOMAIN}", [], ttl=300, cname=f"web01.{DOMAIN}")
        add(f"web01.{DOMAIN}", ["10.0.2.30"], ["fd00::80"], ttl=300)
        for name in ["www.example.com", "portal.example.org", "login.example.net", "updates.vendor.example",
                     "api.weather.example", "static.example.net", "telemetry.vendor.example",
                     "ocsp.ca.example", "time.example.org", "news.example.com"]:
            if r.random() < 0.5:
                edge = name.replace(".", "-") + ".edge.cdn.example"
                add(name, [], ttl=r.choice([60, 300, 3600]), cname=edge, remote=True)
                add(edge, [f"198.51.100.{r.randrange(1, 254)}" for _ in range(r.randrange(1, 4))],
                    [f"2001:db8:100::{r.randrange(1, 0xffff):x}"], ttl=20, remote=True)
            else:
                add(name, [f"203.0.113.{r.randrange(1, 254)}" for _ in range(r.randrange(1, 3))],
                    [f"2001:db8:200::{r.randrange(1, 0xffff):x}"] if r.random() < 0.5 else [],
                    ttl=r.choice([300, 600, 3600]), remote=True)
        for name in ["wpad." + DOMAIN, "isatap." + DOMAIN, "oldprinter." + DOMAIN, "tracker.example.invalid",
                     "fileserver2." + DOMAIN]:
            add(name, nx=True, ttl=60)
        add("big.records." + DOMAIN, [f"10.0.9.{i}" for i in range(1, 61)], ttl=120)
        return z

    def lookup_names(self) -> list[str]:
        return [n for n in self.zone if not n.startswith("big.") and ".edge." not in n]

