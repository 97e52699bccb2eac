"""The recording driver shared by samples/make_real.py and samples/make_eval.py.

A script describes its scenarios (name -> module in this package, build function, Debian packages,
Python modules, has a healthy twin) and its manifest header in a ``Driver``; ``Driver.main`` then
does the rest the same way for both: ``--list``, requirement checks (``--check``), the root check,
one temporary work directory and ``core.Lab`` (namespaces, processes, tcpdump) per half of a
scenario, the capture moved to OUT only when the scenario succeeded, the tshark facts, a scenario
recorded again while tcpdump reports dropped packets (up to ``attempts`` times), stale
namespaces removed before and after, and OUT/MANIFEST.toml merged and rewritten.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import core, tomlw

COMMON_DEBS = ["iproute2", "tcpdump", "tshark"]   # tshark also brings editcap (wireshark-common)
PY_MODULES = {"dns": "dnspython", "ldap3": "ldap3", "smbprotocol": "smbprotocol"}

# name -> (module, build function, Debian packages, Python modules, has healthy twin)
Scenarios = dict[str, tuple[str, str, list[str], list[str], bool]]


def installed(pkg: str) -> bool:
    """dpkg says installed ("ii"); core.deb_version also answers for removed packages whose
    configuration files are left ("rc")."""
    r = core.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", pkg], check=False)
    return r.returncode == 0 and r.stdout.startswith("ii")


def has_version(pkg: str) -> bool:
    """dpkg knows a version of PKG (installed, or removed with its configuration files left)."""
    return core.deb_version(pkg) != "not installed"


@dataclass
class Driver:
    script: str                                   # "make_real.py": for messages
    scenarios: Scenarios
    header: str                                   # MANIFEST.toml's leading comment
    add_facts: Callable[[dict, Path], None]       # [capture.tshark] etc. of a capture in OUT
    work_prefix: str                              # temporary work directories' name prefix
    work_label_chars: int | None = None           # ... followed by this much of the label (None: all)
    is_installed: Callable[[str], bool] = installed
    managed_debs: tuple[str, ...] = ()            # packages the script installs per scenario itself
    attempts: int = 1                             # recordings of a scenario while tcpdump drops
    before_build: Callable[[str], None] | None = None    # called with the scenario's name
    list_widths: tuple[int, int] = (22, 45)       # --list: name and package columns
    check_note: str = ""

    def add_arguments(self, ap: argparse.ArgumentParser, default_out: Path) -> None:
        ap.add_argument("--out", type=Path, default=default_out, help="where captures and MANIFEST.toml go")
        ap.add_argument("--only", default="", help="comma-separated scenario names (see --list)")
        ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
        ap.add_argument("--check", action="store_true", help="check the requirements and exit")
        ap.add_argument("--pathological-only", action="store_true",
                        help="skip the healthy twins (faster, for development)")
        ap.add_argument("--keep-workdir", action="store_true",
                        help="keep the temporary server directories (kept anyway on failure)")

    def order_key(self, entry: dict) -> tuple:
        names = list(self.scenarios)
        sc = entry.get("scenario", "")
        return (names.index(sc) if sc in names else len(names), entry.get("healthy", False))

    def missing_requirements(self, names: list[str]) -> tuple[list[str], list[str]]:
        debs = set(COMMON_DEBS)
        mods: set[str] = set()
        for n in names:
            debs.update(d for d in self.scenarios[n][2] if d not in self.managed_debs)
            mods.update(self.scenarios[n][3])
        miss_debs = sorted(d for d in debs if not self.is_installed(d))
        miss_mods = sorted(PY_MODULES[m] for m in mods if importlib.util.find_spec(m) is None)
        return miss_debs, miss_mods

    def build_one(self, name: str, healthy: bool, out: Path, keep: bool) -> dict:
        """Run one half of a scenario in its own namespaces; the capture is written to the
        temporary directory first and moved to OUT only when the scenario succeeded."""
        mod_name, fn_name, *_ = self.scenarios[name]
        if self.before_build:
            self.before_build(name)
        mod = importlib.import_module(f"realkit.{mod_name}")
        build = getattr(mod, fn_name)
        label = f"{name}{'-healthy' if healthy else ''}"
        workdir = Path(tempfile.mkdtemp(prefix=f"{self.work_prefix}{label[:self.work_label_chars]}-"))
        stage = workdir / "capture"
        stage.mkdir()
        lab = core.Lab(label, workdir)
        core.log(f"=== {label} (work dir {workdir})")
        try:
            try:
                entry = build(lab, stage, healthy)
            finally:
                lab.close()
            if entry.pop("pcapng", False):
                core.to_pcapng(stage / entry["file"].replace(".pcapng", ".pcap"))
            shutil.move(str(stage / entry["file"]), str(out / entry["file"]))
        except BaseException:
            core.log(f"{label} failed; server logs in {workdir}")
            keep = True
            raise
        finally:
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
        self.add_facts(entry, out)
        return entry

    def record(self, name: str, healthy: bool, out: Path, keep: bool) -> dict:
        """build_one, again (up to ``attempts`` times in all) while tcpdump reports drops."""
        for attempt in range(1, self.attempts + 1):
            entry = self.build_one(name, healthy, out, keep)
            dropped = entry.get("measured", {}).get("capture_dropped", 0)
            if dropped == 0 or attempt == self.attempts:
                return entry
            core.log(f"tcpdump dropped {dropped} packets: recording again ({attempt + 1}/{self.attempts})")
        raise AssertionError("unreachable")

    def variants(self, name: str, args: argparse.Namespace) -> list[bool]:
        """The halves to record: False (pathological), True (healthy twin)."""
        out = [False] + ([True] if self.scenarios[name][4] and not args.pathological_only else [])
        return [v for v in out if v] if getattr(args, "healthy_only", False) else out

    def write_manifest(self, out: Path, new_entries: list[dict]) -> tuple[Path, int]:
        """OUT/MANIFEST.toml: the old entries, less those of a rebuilt file or (scenario, half),
        plus NEW_ENTRIES, in scenario order."""
        path = out / "MANIFEST.toml"
        old: list[dict] = []
        if path.exists():
            old = tomllib.loads(path.read_text()).get("capture", [])
        new_files = {e["file"] for e in new_entries}
        rebuilt = {(e["scenario"], e["healthy"]) for e in new_entries}
        merged = [e for e in old if e["file"] not in new_files
                  and (e.get("scenario"), e.get("healthy")) not in rebuilt] + new_entries
        merged.sort(key=self.order_key)
        path.write_text(tomlw.dump_manifest(merged, self.header))
        return path, len(merged)

    def list_scenarios(self) -> None:
        wn, wd = self.list_widths
        for n, (_, _, debs, mods, twin) in self.scenarios.items():
            print(f"{n:{wn}s} debs: {' '.join(debs):{wd}s} python: {' '.join(PY_MODULES[m] for m in mods)}"
                  f"{'  (+ healthy twin)' if twin else ''}")

    def main(self, args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
        """--list, --check, or record the scenarios of --only (default: all) into --out."""
        if args.list:
            self.list_scenarios()
            return 0
        names = [n.strip() for n in args.only.split(",") if n.strip()] or list(self.scenarios)
        unknown = [n for n in names if n not in self.scenarios]
        if unknown:
            ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(self.scenarios)}")
        miss_debs, miss_mods = self.missing_requirements(names)
        if miss_debs or miss_mods:
            if miss_debs:
                print("missing Debian packages; install them with\n  apt-get install "
                      + " ".join(miss_debs), file=sys.stderr)
            if miss_mods:
                print("missing Python client libraries; install them into the interpreter that runs "
                      "this script, e.g.\n  pip install " + " ".join(miss_mods)
                      + "\n(or: pip install -e '.[samples]')", file=sys.stderr)
            return 2
        if args.check:
            print("all requirements present" + (f" ({self.check_note})" if self.check_note else ""))
            return 0
        if os.geteuid() != 0:
            print(f"{self.script} needs root (network namespaces, tcpdump, servers)", file=sys.stderr)
            return 2

        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        core.cleanup_stale()
        new_entries: list[dict] = []
        failed: list[str] = []
        t0 = time.time()
        for n in names:
            for healthy in self.variants(n, args):
                try:
                    new_entries.append(self.record(n, healthy, out, args.keep_workdir))
                except KeyboardInterrupt:
                    core.cleanup_stale()
                    raise
                except Exception:
                    traceback.print_exc()
                    failed.append(f"{n}{' (healthy)' if healthy else ''}")
        core.cleanup_stale()
        path, n = self.write_manifest(out, new_entries)
        core.log(f"wrote {path} ({n} captures) in {time.time() - t0:.0f} s")
        if failed:
            core.log(f"FAILED: {', '.join(failed)}")
            return 1
        return 0
