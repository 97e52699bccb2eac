"""NFS-Ganesha (Debian's user-space NFS server, VFS backend) in a network namespace of a scenario.

The kernel here has no nfsd, so the server side of the NFS samples is ``ganesha.nfsd`` run in the
foreground (``-F``) inside the scenario's server namespace, exporting a temporary directory with
FSAL VFS.  NFSv4 only by default (no rpcbind needed); ``nfs3_udp=True`` also enables NFSv3 and the
MOUNT protocol over UDP, for which Ganesha registers with rpcbind, started here in the same
namespace.  The client side is :mod:`samples.realkit.nfs_client`.

Config choices and why:
- ``Graceless = true``: no 90 s grace period after start (every OPEN would get NFS4ERR_GRACE);
- ``Lease_Lifetime``: 15 s so a client's lease renewal (RENEW / SEQUENCE at 2/3 of the lease, as
  the Linux client's nfs4_schedule_state_renewal does) shows within a < 1 min capture;
- ``Only_Numeric_Owners``: no idmapping daemon; ``Enable_NLM/RQUOTA = false``: not recorded;
- fixed ports (NFS 2049, MOUNT 20048) so the clients need no portmapper look-up.

Delegations (the recall scenario, scen_nfs_deleg.py): Ganesha's VFS backend grants none; FSAL GLUSTER
does, through GlusterFS leases.  :func:`start_gluster` runs glusterd (foreground, its state, run
directory and CLI socket in the lab's work directory) and a single-brick volume with
``features.leases on``; ``start_ganesha(..., gluster=...)`` exports it with ``Delegations = true``
(NFSv4 block) and ``Delegations = RW`` (EXPORT block, default None).  Ganesha 4.3 binds dual-stack IPv6
sockets whenever socket(AF_INET6) works, and then FSAL GLUSTER's glfs_lease fails (EINVAL: the lease id
is built from the caller's address); it binds IPv4 sockets only when socket(AF_INET6) fails with
EAFNOSUPPORT, so ``ipv4_only`` runs it with a small LD_PRELOAD shim (compiled here with cc) that makes
exactly that call fail, as on a kernel without IPv6.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .core import Lab, Netns, deb_version, log, wait_for

GANESHA = "/usr/sbin/ganesha.nfsd" if Path("/usr/sbin/ganesha.nfsd").exists() else "/usr/bin/ganesha.nfsd"
RPCBIND = "/usr/sbin/rpcbind" if Path("/usr/sbin/rpcbind").exists() else "/sbin/rpcbind"
NFS_PORT = 2049
MOUNT_PORT = 20048
PSEUDO_ROOT = "/export"      # the export's NFSv4 pseudo path; MOUNT path for NFSv3
LEASE_LIFETIME_S = 15


@dataclass
class GaneshaServer:
    """A running ganesha.nfsd: its address, export directory and process."""
    addr: str
    export_dir: Path
    proc: subprocess.Popen
    rpcbind: subprocess.Popen | None
    config_text: str

    def stall(self) -> None:
        """SIGSTOP the server (all its threads): requests queue in the socket buffers."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


def ganesha_version() -> str:
    return f"nfs-ganesha {deb_version('nfs-ganesha')} (FSAL VFS {deb_version('nfs-ganesha-vfs')})"


def gluster_ganesha_version() -> str:
    return (f"nfs-ganesha {deb_version('nfs-ganesha')} (FSAL GLUSTER {deb_version('nfs-ganesha-gluster')}), "
            f"glusterfs-server {deb_version('glusterfs-server')}")


def _params(extra: dict[str, str] | None) -> str:
    """Extra ``Key = value;`` lines of a config block (scenario-specific settings)."""
    return "".join(f"    {k} = {v};\n" for k, v in (extra or {}).items())


def ganesha_config(addr: str, export_dir: Path, recovery_dir: Path, nfs3_udp: bool,
                   minor_versions: tuple[int, ...] = (0, 1), core_extra: dict[str, str] | None = None,
                   v4_extra: dict[str, str] | None = None, fsal: str = "Name = VFS;",
                   export_extra: dict[str, str] | None = None, export_path: str | None = None) -> str:
    """The config text. CORE_EXTRA / V4_EXTRA / EXPORT_EXTRA: more NFS_CORE_PARAM / NFSv4 / EXPORT settings
    (V4_EXTRA's ``Delegations`` replaces the default false); FSAL: the body of the export's FSAL block;
    EXPORT_PATH: the export's Path (default EXPORT_DIR; "/" for a Gluster volume)."""
    v4_extra = {"Delegations": "false", **(v4_extra or {})}
    protocols = "3, 4" if nfs3_udp else "4"
    transports = '"UDP", "TCP"' if nfs3_udp else '"TCP"'
    return f"""NFS_CORE_PARAM {{
    Bind_addr = {addr};
    NFS_Port = {NFS_PORT};
    MNT_Port = {MOUNT_PORT};
    Protocols = {protocols};
    Enable_UDP = {"true" if nfs3_udp else "false"};
    Enable_NLM = false;
    Enable_RQUOTA = false;
{_params(core_extra)}}}
NFSv4 {{
    Graceless = true;
    Lease_Lifetime = {LEASE_LIFETIME_S};
    Minor_Versions = {", ".join(str(v) for v in minor_versions)};
    RecoveryRoot = "{recovery_dir}";
    Only_Numeric_Owners = true;
{_params(v4_extra)}}}
EXPORT {{
    Export_Id = 1;
    Path = "{export_path or export_dir}";
    Pseudo = "{PSEUDO_ROOT}";
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = {protocols};
    Transports = {transports};
{_params(export_extra)}    FSAL {{ {fsal} }}
}}
LOG {{
    Default_Log_Level = EVENT;
}}
"""


def _port_open(ns: Netns, addr: str, port: int) -> bool:
    with ns:
        s = socket.socket()
        s.settimeout(0.3)
        try:
            s.connect((addr, port))
            return True
        except OSError:
            return False
        finally:
            s.close()


def start_ganesha(lab: Lab, ns: Netns, addr: str, files: dict[str, bytes], nfs3_udp: bool = False,
                  minor_versions: tuple[int, ...] = (0, 1), gluster: "GlusterServer | None" = None,
                  ipv4_only: bool = False, **config) -> GaneshaServer:
    """Write the export (FILES: relative path -> content) and the config, start ganesha.nfsd in NS
    listening on ADDR (and rpcbind before it when NFS3_UDP), wait until NFS answers on TCP. CONFIG: more
    settings for :func:`ganesha_config` (core_extra, v4_extra, fsal, export_extra).  GLUSTER: export that
    volume with FSAL GLUSTER instead (FILES are then already on its brick: :func:`start_gluster`) with
    delegations on; IPV4_ONLY: run ganesha.nfsd with the no-AF_INET6 shim (see the module docstring)."""
    d = lab.workdir / "ganesha"
    if d.exists():
        shutil.rmtree(d)
    export_dir, recovery_dir = d / "export", d / "recovery"
    export_dir.mkdir(parents=True)
    recovery_dir.mkdir()
    if gluster is None:
        for rel, data in files.items():
            p = export_dir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    else:
        export_dir = gluster.brick_dir
        config.setdefault("fsal", f'Name = GLUSTER; Hostname = "{gluster.addr}"; Volume = "{gluster.volume}";')
        config.setdefault("export_path", "/")
        config["v4_extra"] = {"Delegations": "true", **(config.get("v4_extra") or {})}
        config["export_extra"] = {"Delegations": "RW", **(config.get("export_extra") or {})}
    conf = ganesha_config(addr, export_dir, recovery_dir, nfs3_udp, minor_versions, **config)
    (d / "ganesha.conf").write_text(conf)
    rpcb = None
    if nfs3_udp:
        if Path("/run/rpcbind.sock").exists():
            raise RuntimeError("/run/rpcbind.sock exists: another rpcbind runs; not starting ours")
        # -f: foreground (so it is ours to stop by PID)
        rpcb = lab.spawn(ns, "rpcbind", [RPCBIND, "-f"])
        wait_for(lambda: _port_open(ns, "127.0.0.1", 111), 10, "rpcbind")
    env = {"LD_PRELOAD": str(_no_inet6_shim(d))} if ipv4_only else None
    proc = lab.spawn(ns, "ganesha", [GANESHA, "-F", "-f", str(d / "ganesha.conf"), "-L",
                                     str(d / "ganesha.log"), "-N", "NIV_EVENT", "-p", str(d / "ganesha.pid")],
                     env=env)
    try:
        wait_for(lambda: proc.poll() is not None or _port_open(ns, addr, NFS_PORT), 30, "ganesha on 2049")
    except TimeoutError:
        log((d / "ganesha.log").read_text(errors="replace")[-3000:])
        raise
    if proc.poll() is not None:
        raise RuntimeError("ganesha.nfsd exited: " + (d / "ganesha.log").read_text(errors="replace")[-3000:])
    time.sleep(0.5)
    log(f"ganesha up on {addr}:{NFS_PORT} exporting {export_dir} as {PSEUDO_ROOT}")
    return GaneshaServer(addr, export_dir, proc, rpcb, conf)


def stop_ganesha(lab: Lab, srv: GaneshaServer) -> None:
    """Stop ganesha.nfsd (and our rpcbind) by PID; a stalled server is continued first."""
    if srv.proc.poll() is None:
        os.kill(srv.proc.pid, signal.SIGCONT)
    lab.stop(srv.proc, signal.SIGTERM, timeout=10)
    if srv.rpcbind is not None:
        lab.stop(srv.rpcbind, signal.SIGTERM, timeout=5)
        # rpcbind leaves its socket behind; ours is stopped, so these files are ours
        for leftover in ("/run/rpcbind.sock", "/run/rpcbind.lock"):
            Path(leftover).unlink(missing_ok=True)


# --------------------------------------------------------------------------- GlusterFS (delegations)
GLUSTERD = "/usr/sbin/glusterd"
GLUSTER_CLI = "/usr/sbin/gluster"
GLUSTERD_PORT = 24007
GLUSTER_VOLUME = "V"

_NO_INET6_C = r"""
/* socket(AF_INET6, ...) fails with EAFNOSUPPORT, as on a kernel without IPv6: ganesha.nfsd 4.3 then
 * binds IPv4 sockets only (nfs_rpc_dispatcher_thread.c Allocate_sockets -> Allocate_sockets_V4). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>
int socket(int domain, int type, int protocol)
{
	static int (*real)(int, int, int);
	if (domain == AF_INET6) {
		errno = EAFNOSUPPORT;
		return -1;
	}
	if (!real)
		real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
	return real(domain, type, protocol);
}
"""


def _no_inet6_shim(d: Path) -> Path:
    src, so = d / "noinet6.c", d / "noinet6.so"
    src.write_text(_NO_INET6_C)
    r = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(so), str(src), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"could not build the no-AF_INET6 shim: {r.stderr[-1000:]}")
    return so


@dataclass
class GlusterServer:
    """glusterd and one single-brick volume: its address, brick directory, processes, CLI socket."""
    addr: str
    volume: str
    brick_dir: Path
    state_dir: Path
    run_dir: Path
    glusterd: subprocess.Popen
    ns: Netns

    def cli(self, *args: str, check: bool = True) -> str:
        with self.ns:
            r = subprocess.run([GLUSTER_CLI, f"--glusterd-sock={self.run_dir / 'glusterd.socket'}", "--mode=script",
                                f"--log-file={self.run_dir.parent / 'cli.log'}", *args],
                               capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"gluster {' '.join(args)}: {r.stdout.strip()} {r.stderr.strip()}")
        return r.stdout

    def brick_pids(self) -> list[int]:
        out = []
        for f in (self.run_dir / "vols" / self.volume).glob("*.pid"):
            try:
                out.append(int(f.read_text().strip()))
            except (OSError, ValueError):
                pass
        return out


def start_gluster(lab: Lab, ns: Netns, addr: str, files: dict[str, bytes],
                  options: dict[str, str] | None = None) -> GlusterServer:
    """glusterd in NS (foreground, by PID; working directory, run directory and CLI socket under the lab's
    work directory, IPv4), FILES written on a brick directory there, one volume of that single brick with
    ``features.leases on`` (what FSAL GLUSTER's delegations need) plus OPTIONS, started."""
    d = lab.workdir / "gluster"
    if d.exists():
        shutil.rmtree(d)
    state_dir, run_dir, brick_dir = d / "state", d / "run", d / "brick"
    for p in (state_dir, run_dir, brick_dir):
        p.mkdir(parents=True)
    for rel, data in files.items():
        p = brick_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    vol = d / "glusterd.vol"
    vol.write_text(f"""volume management
    type mgmt/glusterd
    option working-directory {state_dir}
    option run-directory {run_dir}
    option glusterd-sockfile {run_dir / 'glusterd.socket'}
    option transport-type socket
    option transport.address-family inet
    option transport.socket.listen-port {GLUSTERD_PORT}
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
""")
    proc = lab.spawn(ns, "glusterd", [GLUSTERD, "-N", "-f", str(vol), "-p", str(d / "glusterd.pid"),
                                      "-l", str(d / "glusterd.log")])
    wait_for(lambda: proc.poll() is not None or (run_dir / "glusterd.socket").exists(), 30, "glusterd socket")
    if proc.poll() is not None:
        raise RuntimeError("glusterd exited: " + (d / "glusterd.log").read_text(errors="replace")[-3000:])
    g = GlusterServer(addr, GLUSTER_VOLUME, brick_dir, state_dir, run_dir, proc, ns)
    wait_for(lambda: _cli_ok(g), 30, "glusterd CLI")
    g.cli("volume", "create", g.volume, f"{addr}:{brick_dir}", "force")
    for k, v in {"features.leases": "on", **(options or {})}.items():
        g.cli("volume", "set", g.volume, k, v)
    g.cli("volume", "start", g.volume)
    wait_for(lambda: bool(g.brick_pids()), 30, "the brick process")
    log(f"gluster volume {g.volume} up on {addr}:{brick_dir} (bricks {g.brick_pids()})")
    return g


def _cli_ok(g: GlusterServer) -> bool:
    with g.ns:
        r = subprocess.run([GLUSTER_CLI, f"--glusterd-sock={g.run_dir / 'glusterd.socket'}", "--mode=script",
                            f"--log-file={g.run_dir.parent / 'cli.log'}", "volume", "list"],
                           capture_output=True, text=True, timeout=30)
    return r.returncode == 0 or "No volumes present" in r.stdout + r.stderr


def stop_gluster(lab: Lab, g: GlusterServer) -> None:
    """Stop the volume (its brick process), then glusterd, by PID; the brick's socket file is removed."""
    bricks = g.brick_pids()
    sockets = [_brick_socket(pid) for pid in bricks]
    try:
        g.cli("volume", "stop", g.volume, check=False)
    except Exception as e:   # keep stopping
        log(f"gluster volume stop: {e}")
    for pid in bricks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    lab.stop(g.glusterd, signal.SIGTERM, timeout=10)
    for pid in bricks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for f in (g.run_dir / "vols").rglob("*.pid"):
        f.unlink(missing_ok=True)
    for sock in sockets:      # glusterfsd -S /var/run/gluster/<hash>.socket: our brick's, left behind
        if sock is not None:
            sock.unlink(missing_ok=True)


def _brick_socket(pid: int) -> Path | None:
    """The unix socket a brick process (glusterfsd) was started with (its ``-S`` argument)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for i, a in enumerate(argv[:-1]):
        if a == b"-S" and argv[i + 1].startswith(b"/var/run/gluster/"):
            return Path(argv[i + 1].decode())
    return None
