"""Network namespaces, processes and captures for the real-server sample scenarios.

The calling thread moves between namespaces with setns(2) (``with ns:``); threads and
processes started inside such a block stay in that namespace.  Nothing here touches the
root namespace's interfaces: veth pairs are created with both ends in our own namespaces.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

PREFIX = "hsreal-"
# the detectors a manifest entry names (silent, below_high)
ALL_DETECTORS = ["herd", "retry_storm", "smb_break_queue", "tcp_stall", "toctou", "conn_churn", "replay", "saturation",
                 "incast", "replication_conflict", "lock_polling", "delegation_recall"]
# detectors added after the first scenarios were written: silent on every one of them that names its
# silent detectors one by one (checked on the recorded captures when they were added)
ADDED_DETECTORS = ["replay", "saturation", "incast", "replication_conflict"]
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stall_group(proc, seconds: float, name: str) -> tuple[float, float]:
    """Stop a server's whole process group (SIGSTOP: nsd serves from a forked child) for ``seconds``,
    then let it go on; returns the wall-clock times it was stopped and continued."""
    os.killpg(proc.pid, signal.SIGSTOP)
    t_stop = time.time()
    log(f"{name} {proc.pid} stopped (SIGSTOP)")
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGCONT)
    t_cont = time.time()
    log(f"{name} {proc.pid} continued (SIGCONT)")
    return t_stop, t_cont


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, capture_output=True, **kw)


def list_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup_stale(prefix: str = PREFIX) -> None:
    """Remove namespaces left by an earlier, interrupted run (and the processes inside them).

    Namespace names carry the PID of the make_real.py that made them; those of a run that is
    still going are left alone."""
    for name in list_namespaces():
        if not name.startswith(prefix):
            continue
        owner = name[len(prefix):].split("-", 1)[0]
        if owner.isdigit() and Path(f"/proc/{owner}").exists() and int(owner) != os.getpid():
            continue  # belongs to another make_real.py that is still running
        pids = run(["ip", "netns", "pids", name], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        run(["ip", "netns", "del", name], check=False)
        log(f"removed stale namespace {name} (killed {len(pids)} processes in it)")


class Netns:
    """One network namespace; ``with ns:`` runs the current thread inside it."""

    def __init__(self, name: str):
        if len(name) > 40:
            raise ValueError(name)
        self.name = name
        run(["ip", "netns", "add", name])
        self.fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        self._saved: list[int] = []
        self.ip("link", "set", "lo", "up")

    def ip(self, *args: str) -> str:
        return run(["ip", "-n", self.name, *args]).stdout

    def sysctl(self, key: str, value) -> None:
        with self:
            Path("/proc/sys/" + key.replace(".", "/")).write_text(f"{value}\n")

    def __enter__(self):
        self._saved.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY))
        _setns(self.fd)
        return self

    def __exit__(self, *exc):
        fd = self._saved.pop()
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        out = run(["ip", "netns", "pids", self.name], check=False).stdout
        return [int(p) for p in out.split()]

    def delete(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        run(["ip", "netns", "del", self.name], check=False)


class Lab:
    """Namespaces, processes and captures of one scenario run; ``close()`` undoes all of it."""

    def __init__(self, scenario: str, workdir: Path):
        self.scenario = scenario
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.namespaces: list[Netns] = []
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.threads: list[threading.Thread] = []
        tag = "".join(c for c in scenario if c.isalnum())[:10]
        self._tag = f"{PREFIX}{os.getpid()}-{tag}"

    # -- namespaces and links ------------------------------------------------------------
    def netns(self, short: str) -> Netns:
        ns = Netns(f"{self._tag}-{short}")
        self.namespaces.append(ns)
        return ns

    def veth(self, a: Netns, a_if: str, b: Netns, b_if: str) -> None:
        """A veth pair with one end in each of our namespaces (never the root namespace)."""
        a.ip("link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b.name)
        # gso_max_segs 1: the capture shows wire-sized frames, not 64 KB GSO super-packets
        a.ip("link", "set", a_if, "gso_max_segs", "1", "up")
        b.ip("link", "set", b_if, "gso_max_segs", "1", "up")

    # -- processes ------------------------------------------------------------------------
    def spawn(self, ns: Netns | None, name: str, argv: list[str], env: dict | None = None,
              stdin=subprocess.DEVNULL, new_session: bool = True, **kw) -> subprocess.Popen:
        logf = open(self.workdir / f"{name}.log", "ab")
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        ctx = ns if ns is not None else contextlib.nullcontext()
        with ctx:
            p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=stdin,
                                 env=full_env, start_new_session=new_session, **kw)
        logf.close()
        self.procs.append((name, p))
        log(f"started {name} pid {p.pid}: {' '.join(argv)[:150]}")
        return p

    def logtail(self, name: str, n: int = 30) -> str:
        p = self.workdir / f"{name}.log"
        if not p.exists():
            return ""
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])

    def stop(self, p: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 5.0) -> None:
        if p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGKILL)
            p.wait(5)

    def close(self) -> None:
        for name, p in reversed(self.procs):
            try:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)   # a SIGSTOPped server must see the TERM
                self.stop(p)
            except Exception as e:  # keep cleaning
                log(f"could not stop {name} ({p.pid}): {e}")
        for ns in self.namespaces:
            # anything still inside our namespace was started by this scenario (e.g. smbd children)
            for pid in ns.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        for ns in self.namespaces:
            ns.delete()
        self.namespaces.clear()


def start_threads(target, n: int) -> list[threading.Thread]:
    """N daemon threads running TARGET(i), i = 0..N-1, started (a thread that enters a
    namespace with ``with ns:`` switches only itself)."""
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def join_all(threads: list[threading.Thread], timeout: float) -> None:
    """Wait for each of THREADS, up to TIMEOUT seconds each."""
    for t in threads:
        t.join(timeout)


def wait_for(pred, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


class Capture:
    """tcpdump on one interface of one namespace, writing pcap (µs or ns)."""

    def __init__(self, lab: Lab, ns: Netns, iface: str, path: Path, snaplen: int = 0,
                 nano: bool = False, bpf: str = ""):
        self.lab, self.path = lab, path
        self.name = f"tcpdump-{path.stem}"
        argv = ["tcpdump", "-i", iface, "-w", str(path), "-s", str(snaplen), "-B", "16384",
                "--immediate-mode", "-U", "-n", "-Z", "root"]
        if nano:
            argv += ["--time-stamp-precision", "nano"]
        if bpf:
            argv += bpf.split()
        self.proc = lab.spawn(ns, self.name, argv)
        wait_for(lambda: "listening on" in lab.logtail(self.name), 10, "tcpdump to start")
        time.sleep(0.3)

    def stop(self) -> dict:
        time.sleep(0.5)
        self.lab.stop(self.proc, signal.SIGINT, timeout=10)
        text = self.lab.logtail(self.name, 10)
        stats = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0].isdigit():
                if "captured" in line:
                    stats["captured"] = int(parts[0])
                elif "dropped by kernel" in line:
                    stats["dropped_by_kernel"] = int(parts[0])
        log(f"capture {self.path.name}: {stats}")
        return stats


def first_packet_time(path: Path) -> float:
    """Timestamp (epoch seconds) of the first packet of a pcap file as tcpdump writes it."""
    with open(path, "rb") as f:
        hdr = f.read(24)
        magic = hdr[:4]
        if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
            endian = "<"
        elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
            endian = ">"
        else:
            raise ValueError(f"{path}: not a pcap file")
        nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
        rec = f.read(16)
        if len(rec) < 16:
            raise ValueError(f"{path}: no packets")
        sec, frac, _, _ = struct.unpack(endian + "IIII", rec)
        return sec + frac / (1e9 if nano else 1e6)


def to_pcapng(path: Path) -> Path:
    out = path.with_suffix(".pcapng")
    run(["editcap", "-F", "pcapng", str(path), str(out)])
    path.unlink()
    return out


def deb_version(pkg: str) -> str:
    r = run(["dpkg-query", "-W", "-f", "${Version}", pkg], check=False)
    return r.stdout.strip() if r.returncode == 0 else "not installed"


def made_with_versions(*pkgs: str) -> str:
    return ", ".join(f"{p} {deb_version(p)}" for p in pkgs)
