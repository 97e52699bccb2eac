"""Generated RoCEv2 captures for the tests (issue 16): ``rocev2_capture(scenario, scale, seed)`` runs
``samples/rocev2_synth.py``'s generator (in-process, ``rocekit.writer.generate``) once per
(scenario, scale, seed) and caches the pcapng + ``.labels.json`` under ``tests/artifacts/rocev2/<hash>/``
(gitignored; ``make clean`` removes it). ``<hash>`` is a digest of the generator's sources
(``samples/rocev2_synth.py``, ``samples/rocekit/``, ``samples/synthkit/`` and the decoder's wire
tables ``analyzer/decoders/rocev2_layout.py`` that rocekit.wire imports): changing the generator
regenerates, an unchanged one reuses the files across test sessions (an old digest's directory is
left for ``make clean``).

Concurrency (xdist workers, two sessions): each key is generated under an exclusive ``flock`` on its own
lock file, into a temporary name, then ``os.replace``d into place (labels first, the capture last: a
capture that exists always has its labels). Readers never see a half-written file.

``record(scenario, scale, seed, detectors, first_ns)`` is the capture as a ground-truth record in
``samples/groundtruth.py``'s schema (the one copy, used by tests/test_detectors_samples.py and
tests/benchmarks/evaluate.py): the labels as expectations, every detector they do not name silent.

These captures are GENERATED, not recorded (see samples/rocekit/README.md).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
CACHE = Path(os.environ.get("HERDSCOPE_ROCEV2_CACHE", ROOT / "tests" / "artifacts" / "rocev2"))
PREFIX = "rocev2-"

SLACK_S = 200e-6  # a finding may start this long before its label's interval, or after its end
# a healthy twin that is itself a pathology (samples/rocekit/README.md: the cnp-ignored twin is an incast
# with DCQCN on): its detector may report, but not the kind it is the twin for
TWIN_ALLOWS = {"rocev2-cnp-ignored-healthy": ("ecn_congestion", "cnp_no_slowdown")}
# ... and a pathology whose detector must not report another kind (the incast has DCQCN on: senders slow)
SILENT_KINDS = {"rocev2-incast": ("ecn_congestion/cnp_no_slowdown",)}

_memo: dict[tuple[str, float, int], Path] = {}
_digest: str | None = None


def generator_digest() -> str:
    """A digest of every source file the generator reads (its CLI, rocekit/, synthkit/, the wire tables)."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        files = [SAMPLES / "rocev2_synth.py", *sorted((SAMPLES / "rocekit").glob("*.py")),
                 *sorted((SAMPLES / "synthkit").glob("*.py")), ROOT / "analyzer" / "decoders" / "rocev2_layout.py"]
        for f in files:
            h.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        _digest = h.hexdigest()[:16]
    return _digest


def scenarios() -> list[str]:
    """Every scenario name the generator knows (pathologies and healthy twins)."""
    return list(_catalog())


def _catalog() -> dict:
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    from rocekit.catalog import SCENARIOS  # noqa: E402 (samples/ on sys.path, as the generator's CLI does)
    return SCENARIOS


def _name(scenario: str) -> str:
    name = scenario if scenario.startswith(PREFIX) else PREFIX + scenario
    if name not in _catalog():
        raise ValueError(f"unknown RoCEv2 scenario {scenario!r} (known: {', '.join(_catalog())})")
    return name


def rocev2_capture(scenario: str, scale: float = 0.1, seed: int = 1) -> Path:
    """The path of ``scenario``'s generated capture (``"rocev2-gbn-storm"`` or ``"gbn-storm"``) at
    ``scale`` and ``seed``; its labels are at ``<path>.labels.json`` (see :func:`labels`)."""
    name = _name(scenario)
    key = (name, float(scale), int(seed))
    if key in _memo and _memo[key].exists():
        return _memo[key]
    d = CACHE / generator_digest()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}-x{float(scale):g}-s{int(seed)}.pcapng"
    lab = Path(str(path) + ".labels.json")
    if not (path.exists() and lab.exists()):
        with open(str(path) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker generating the same key: wait, then reuse
            if not (path.exists() and lab.exists()):
                _generate(name, float(scale), int(seed), path)
    _memo[key] = path
    return path


def _generate(name: str, scale: float, seed: int, path: Path) -> None:
    _catalog()
    from rocekit.writer import generate  # noqa: E402

    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.pcapng")
    tmp_lab = Path(str(tmp) + ".labels.json")
    try:
        generate(str(tmp), name, seed, scale)
        os.replace(tmp_lab, str(path) + ".labels.json")
        os.replace(tmp, path)
    finally:
        for f in (tmp, tmp_lab):
            if f.exists():
                f.unlink()


def labels(path) -> list[dict]:
    """The generator's labels of a capture (synth.py's label keys; ``[]`` for a healthy twin)."""
    return json.loads(Path(str(path) + ".labels.json").read_text())


def twin_of(scenario: str) -> str | None:
    """The pathology a healthy twin is the twin of (None for a pathology and for rocev2-healthy)."""
    name = _name(scenario)
    base = name.removesuffix("-healthy")
    return base if base != name and base in _catalog() else None


def record(scenario: str, scale: float, seed: int, detectors, first_ns: int | None = None) -> dict:
    """The capture as a groundtruth.py record: ``file``, ``scenario``, ``healthy`` (no labels, and not
    a twin in TWIN_ALLOWS), ``silent`` (every detector of ``detectors`` the labels do not name, plus
    SILENT_KINDS / TWIN_ALLOWS), ``labels`` and, when ``first_ns`` (the first packet) is given,
    ``expect`` (``groundtruth.expects_from_labels`` within SLACK_S)."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    import groundtruth as gt  # noqa: E402

    name = _name(scenario)
    path = rocev2_capture(name, scale, seed)
    labs = labels(path)
    named = {lab["detector"] for lab in labs}
    silent = [d for d in detectors if d not in named] + list(SILENT_KINDS.get(name, ()))
    if name in TWIN_ALLOWS:
        det, kind = TWIN_ALLOWS[name]
        silent = [d for d in silent if d != det] + [f"{det}/{kind}"]
    twin = twin_of(name)
    return {"file": path.name, "path": str(path), "scenario": name, "scale": scale, "seed": seed,
            "healthy": not labs and name not in TWIN_ALLOWS, "labels": labs, "silent": silent,
            "twin": f"{twin}-x{float(scale):g}-s{int(seed)}.pcapng" if twin else None,
            "expect": [] if first_ns is None else [_on_the_wire(e, lab) for e, lab in
                                                   zip(gt.expects_from_labels(labs, first_ns, SLACK_S), labs)]}


def _on_the_wire(expect: dict, label: dict) -> dict:
    """An expectation named as a capture can name it: a PFC storm's pause frames carry MAC addresses,
    not IP ones (the server is the origin port's MAC, ``parameters.origin_mac``, in tshark's
    ``eth.src`` form); an ECN label's resource is the model's switch port (``"h10 port"``), which
    is not on the wire (the destination host is its ``server``)."""
    p = label.get("parameters") or {}
    if p.get("origin_mac"):
        mac = p["origin_mac"].replace(":", "").lower()
        expect = {**expect, "server": ":".join(mac[i:i + 2] for i in range(0, len(mac), 2))}
    if label["detector"] == "ecn_congestion":
        expect = {**expect, "resource": ""}
    return expect
