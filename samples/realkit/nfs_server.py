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
"""
from __future__ import annotations

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


def ganesha_config(addr: str, export_dir: Path, recovery_dir: Path, nfs3_udp: bool,
                   minor_versions: tuple[int, ...] = (0, 1)) -> str:
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
}}
NFSv4 {{
    Graceless = true;
    Lease_Lifetime = {LEASE_LIFETIME_S};
    Minor_Versions = {", ".join(str(v) for v in minor_versions)};
    RecoveryRoot = "{recovery_dir}";
    Only_Numeric_Owners = true;
    Delegations = false;
}}
EXPORT {{
    Export_Id = 1;
    Path = "{export_dir}";
    Pseudo = "{PSEUDO_ROOT}";
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = {protocols};
    Transports = {transports};
    FSAL {{ Name = VFS; }}
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
                  minor_versions: tuple[int, ...] = (0, 1)) -> GaneshaServer:
    """Write the export (FILES: relative path -> content) and the config, start ganesha.nfsd in NS
    listening on ADDR (and rpcbind before it when NFS3_UDP), wait until NFS answers on TCP."""
    d = lab.workdir / "ganesha"
    if d.exists():
        shutil.rmtree(d)
    export_dir, recovery_dir = d / "export", d / "recovery"
    export_dir.mkdir(parents=True)
    recovery_dir.mkdir()
    for rel, data in files.items():
        p = export_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    conf = ganesha_config(addr, export_dir, recovery_dir, nfs3_udp, minor_versions)
    (d / "ganesha.conf").write_text(conf)
    rpcb = None
    if nfs3_udp:
        if Path("/run/rpcbind.sock").exists():
            raise RuntimeError("/run/rpcbind.sock exists: another rpcbind runs; not starting ours")
        # -f: foreground (so it is ours to stop by PID)
        rpcb = lab.spawn(ns, "rpcbind", [RPCBIND, "-f"])
        wait_for(lambda: _port_open(ns, "127.0.0.1", 111), 10, "rpcbind")
    proc = lab.spawn(ns, "ganesha", [GANESHA, "-F", "-f", str(d / "ganesha.conf"), "-L",
                                     str(d / "ganesha.log"), "-N", "NIV_EVENT", "-p", str(d / "ganesha.pid")])
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
