#!/usr/bin/env python3
"""herdscope evaluation: every detector over labelled captures it was not tuned on.

    python tests/benchmarks/evaluate.py [--quick] [--json OUT] [--keep DIR] [--only NAME ...]
                                        [--no-real] [--no-synthetic] [--no-rocev2] [--mixed PACKETS]

Runs every detector (``detectors.run(open_capture(path), only=[name])``, one at a time so that one
that crashes is counted as an error, not the end of the run) over

  samples   the real-server captures of ``samples/MANIFEST.toml``;
  eval      ``samples/eval/MANIFEST.toml`` when it exists (same schema);
  synthetic the parameter sweeps of ``samples/synth_scenarios.py`` (generated into a temporary
            directory, or ``--keep DIR``), each capture with its ground truth as data;
  rocev2    the RoCEv2 scenarios of ``samples/rocev2_synth.py`` (issue 16: every pathology and its
            healthy twin, at ROCEV2_SEEDS x ROCEV2_SCALES), generated once into the cache of
            ``tests/rocev2_captures.py`` (tests/artifacts/rocev2/, reused while the generator is
            unchanged); each label becomes an expectation (``groundtruth.expects_from_labels``: the
            label's detector, server, resource and kind, starting in its interval +- SLACK_S);
            every detector the labels do not name is silent (``rocev2_captures.record``). Generated,
            not recorded: see samples/rocekit/README.md;
  mixed     with ``--mixed N``: synth.py's mixed capture of N packets where 1 % of the TCP connections
            lose their first SYN and 0.5 % a tail segment: the findings at or above medium, by
            detector and kind, and which of synth.py's labels they found (the issue's "a few dozen").

Scoring, per detector (``samples/groundtruth.py`` matches an expectation with findings, the same code
``tests/test_detectors_samples.py`` and ``tests/test_detectors_eval.py`` assert with):

  TP     an expectation (``pathology`` true or absent) matched by a finding at >= its min_severity
         (medium);
  miss   an expectation with no such finding;
  FA     a false alarm: on a pathological capture, a finding >= ``--severity`` (medium) from a
         detector its manifest lists as silent (one per capture and detector); on a healthy twin, a
         finding >= ``--healthy-severity`` (high) from any detector;
  h-med  healthy twins with a finding >= medium but below the FA bar (worth a look, not counted);
  count  TPs whose matching findings were not ``count +- count_tolerance`` (one expected, dozens
         reported: the population problem);
  err    captures on which the detector raised.

Expectations with ``pathology = None`` (a sweep point below the ground truth's floor, see
``synth_scenarios.TRUTH``) are scored on the operating curve only. The operating curve of a sweep
is, per point, the worst severity of the findings matching its expectation at any severity (for
healthy points: the sweep detector's worst finding) and the first value that fires at >= medium: the smallest for
``direction = up`` sweeps (clients, rate, stall length), the largest for ``down`` (RTT, spread,
interval). ``--quick`` runs a small subset (a real pair per detector, one eval pair, a few sweep points, one
RoCEv2 pathology per RoCEv2 detector and its twin, seed 1, ROCEV2_QUICK_SCALE).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "samples"))
sys.path.insert(0, str(ROOT / "tests"))

import polars as pl  # noqa: E402

import groundtruth as gt  # noqa: E402
import rocev2_captures as rc  # noqa: E402
import synth_scenarios as sc  # noqa: E402
from analyzer import open_capture  # noqa: E402
from detectors import available, run  # noqa: E402
from detectors.base import SEVERITIES, SEVERITY_RANK, empty_findings  # noqa: E402

SOURCES = {"samples": ROOT / "samples" / "MANIFEST.toml", "eval": ROOT / "samples" / "eval" / "MANIFEST.toml"}
FAMILY_DETECTOR = {"dns_herd": "herd", "krb_herd": "herd", "ldap_churn": "conn_churn", "retry_storm": "retry_storm",
                   "tcp_loss": "tcp_stall"}
COLUMNS = ("tp", "miss", "fa", "h_med", "count", "err")
SEC = 1_000_000_000
SEV_LETTER = {None: "-", **{s: s[0].upper() for s in SEVERITIES}}
# RoCEv2 (generated): two seeds and two scales per scenario; the ACK-timeout pair runs at least 300 ms
# whatever the scale (its timer is 67 ms), so it is swept above 1 where the scale changes its workload
ROCEV2_SEEDS = (1, 2)
ROCEV2_SCALES = (0.05, 0.1)
ROCEV2_SCALES_OF = {"rocev2-ack-timeout": (1.0, 2.0), "rocev2-ack-timeout-healthy": (1.0, 2.0)}
ROCEV2_QUICK = ("rocev2-pfc-storm", "rocev2-gbn-storm", "rocev2-rnr-loop", "rocev2-incast")  # + twins, seed 1
ROCEV2_QUICK_SCALE = 0.1  # the scale of the golden tests (tests/test_detectors_samples.py)


def analyse(path: Path) -> tuple[pl.DataFrame, int | None, dict[str, str]]:
    """(findings of every detector, first packet ns, {detector: error}) for one capture."""
    errors: dict[str, str] = {}
    frames = []
    try:
        with open_capture(path) as cap:
            first = int(cap.packets["ts_ns"].min()) if cap.packets.height else 0
            for name in available():
                try:
                    frames.append(run(cap, only=[name]))
                except Exception as exc:  # noqa: BLE001 - a detector's crash is a result here
                    errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # noqa: BLE001
        return empty_findings(), None, {"open_capture": f"{type(exc).__name__}: {exc}"[:300]}
    frames = [f for f in frames if f.height]
    findings = pl.concat(frames, how="diagonal_relaxed") if frames else empty_findings()
    return findings, first, errors


def scored(e: dict) -> bool | None:
    """An expectation's ground truth: its ``pathology`` when given (None: a grey sweep point), else a
    pathology when its min_severity is medium or above (the eval manifest marks grey points with
    min_severity "informational": they may fire at any severity below high)."""
    if "pathology" in e:
        return e["pathology"]
    return True if SEVERITY_RANK[e["min_severity"]] >= SEVERITY_RANK["medium"] else None


def judge(record: dict, findings: pl.DataFrame, first: int | None, errors: dict, opts) -> dict:
    """One capture's outcome: per expectation (tp / miss / grey), false alarms, warnings."""
    out = {"file": record["file"], "healthy": bool(record.get("healthy")), "expects": [], "false_alarms": [],
           "healthy_medium": [], "errors": errors, "findings_medium": 0, "by_detector": {}, "worst_by_detector": {}}
    if first is None:
        return out
    med = gt.loud(findings, "medium")
    out["findings_medium"] = med.height
    out["by_detector"] = {d: n for d, n in med.group_by("detector").len().sort("detector").iter_rows()}
    out["worst_by_detector"] = {d: gt.worst(findings.filter(pl.col("detector") == d))
                                for d in sorted(set(findings["detector"].to_list()))}
    for e in record.get("expect", []):
        hits = gt.matches(findings, e, first)
        out["expects"].append({"detector": e["detector"], "kind": e.get("kind"), "start_s": e["start_s"],
                               "pathology": scored(e), "hit": hits.height > 0, "hits": hits.height,
                               "count_ok": gt.count_ok(hits, e),
                               "worst": gt.worst(hits),   # and below min_severity: what it was called instead
                               "near_worst": gt.worst(gt.near(findings, e, first))})
    # silent: nothing >= --severity (>= --healthy-severity on a healthy twin); below_high: nothing >= high
    bars = {d: opts.healthy_severity if out["healthy"] else opts.severity for d in record.get("silent", [])}
    for d in record.get("below_high", []):
        bars[d] = min(bars.get(d, "high"), "high", key=SEVERITY_RANK.get)
    for d, bar in bars.items():      # d: a detector or detector/kind
        det = d.split("/", 1)[0]
        if det in errors:
            continue
        over = gt.loud(findings, bar, d)
        if over.height:
            out["false_alarms"].append({"detector": det, "findings": over.height, "worst": gt.worst(over),
                                        "kinds": sorted(set(over["kind"].to_list()))})
        elif out["healthy"] and gt.loud(findings, "medium", d).height:
            out["healthy_medium"].append(det)
    return out


def tally(results: list[dict], detectors: list[str]) -> dict[str, dict[str, int]]:
    table = {d: dict.fromkeys(COLUMNS, 0) for d in detectors}
    for r in results:
        for e in r["expects"]:
            if e["pathology"] is None:
                continue
            # a labelled detector that is not registered is a row of misses, not left out
            row = table.setdefault(e["detector"], dict.fromkeys(COLUMNS, 0))
            row["tp" if e["hit"] else "miss"] += 1
            if e["hit"] and not e["count_ok"]:
                row["count"] += 1
        for fa in r["false_alarms"]:
            table.setdefault(fa["detector"], dict.fromkeys(COLUMNS, 0))["fa"] += 1
        for d in r["healthy_medium"]:
            table[d]["h_med"] += 1
        for d in r["errors"]:
            if d in table:
                table[d]["err"] += 1
    return table


def curve_of(record: dict, source: str) -> dict | None:
    """Where a capture sits on an operating curve: {name, param, value, direction} or None. Synthetic
    records name their sweep; the eval manifest's ``[capture.sweep]`` gives variable and value, and
    the curve is the scenario's name without its trailing value (dns-herd-dnsmasq-50 -> dns-herd-dnsmasq)."""
    if source == "synthetic":
        sw = next(w for w in sc.SWEEPS if w.name == record["sweep"])
        return {"name": sw.name, "param": sw.param, "value": record["value"], "direction": sw.direction,
                "detector": FAMILY_DETECTOR[sw.family]}
    sweep = record.get("sweep")
    if not isinstance(sweep, dict) or "variable" not in sweep:
        return None
    value = sweep.get("value")
    name = str(record.get("scenario") or record["file"]).removesuffix(f"-{value}")
    return {"name": f"{source}:{name}", "param": sweep["variable"], "value": value, "direction": "up",
            "detector": next((e["detector"] for e in record.get("expect", [])), None)}


def curves(results: list[dict]) -> list[dict]:
    """Per curve: each point's worst severity and whether it fired, the first value that fires
    (pathological points) and the healthy points that fired (false alarms on the curve)."""
    by_curve: dict[str, list[dict]] = {}
    for r in results:
        if r.get("curve"):
            by_curve.setdefault(r["curve"]["name"], []).append(r)
    out = []
    for name, pts in by_curve.items():
        pts = sorted(pts, key=lambda r: (r["curve"]["value"], r["healthy"]))
        c = pts[0]["curve"]
        det = next((r["curve"]["detector"] for r in pts if r["curve"]["detector"]), None)
        points = []
        for r in pts:
            if r["expects"]:      # the worst finding in the expectation's window, at any severity
                w = max((e["near_worst"] for e in r["expects"] if e["near_worst"]), key=SEVERITY_RANK.get,
                        default=None)
                fires = any(e["hit"] for e in r["expects"])
            else:                 # healthy point: the curve detector's worst finding anywhere
                w = r["worst_by_detector"].get(det)
                fires = w is not None and SEVERITY_RANK[w] >= SEVERITY_RANK["medium"]
            points.append({"value": r["curve"]["value"], "worst": w, "fires": fires, "healthy": r["healthy"],
                           "findings_medium": r["by_detector"].get(det, 0)})
        fired = [p["value"] for p in points if p["fires"] and not p["healthy"]]
        first = (min(fired) if c["direction"] == "up" else max(fired)) if fired else None
        out.append({"sweep": name, "detector": det, "param": c["param"], "direction": c["direction"],
                    "points": points, "first_fires": first,
                    "healthy_fires": [p["value"] for p in points if p["fires"] and p["healthy"]]})
    return out


def mixed_run(packets: int, work: Path) -> dict:
    path = work / f"mixed-{packets}.pcap"
    t0 = time.perf_counter()
    summary = sc.mixed(str(path), packets)
    t1 = time.perf_counter()
    findings, first, errors = analyse(path)
    t2 = time.perf_counter()
    med = gt.loud(findings, "medium") if first is not None else findings
    labels = json.loads(Path(str(path) + ".labels.json").read_text())
    found = []
    for lab in labels:      # a label is found by a finding of its detector overlapping its episode (+-1 s)
        near = findings.filter((pl.col("detector") == lab["detector"]) & (pl.col("start_ns") <= lab["end_ns"] + SEC)
                               & (pl.col("end_ns") >= lab["start_ns"] - SEC))
        found.append({"detector": lab["detector"], "resource": lab["resource"], "worst": gt.worst(near),
                      "found": gt.loud(near, "medium").height > 0})
    by = med.group_by("detector", "kind", "severity").len().sort("detector", "kind", "severity")
    first = first or 0
    listed = [{"detector": d, "kind": k, "severity": str(s), "start_s": round((t - first) / SEC, 3), "server": srv,
               "explanation": (x or "")[:240]}
              for d, k, s, t, srv, x in med.select("detector", "kind", "severity", "start_ns", "server",
                                                   "explanation").iter_rows()] if med.height else []
    return {"generate": summary, "generate_s": round(t1 - t0, 1), "analyse_s": round(t2 - t1, 1),
            "findings": findings.height, "findings_medium": med.height, "errors": errors,
            "medium_by": [{"detector": d, "kind": k, "severity": str(s), "n": n} for d, k, s, n in by.iter_rows()],
            "labels_found": found, "medium_findings": listed}


def real_records(quick: bool) -> list[tuple[str, Path, dict]]:
    out = []
    for source, manifest in SOURCES.items():
        if not manifest.exists():
            continue
        recs = gt.load_manifest(manifest)
        if quick:       # samples: per detector its first pathological capture and twin; eval: one pair
            keep, seen = set(), set()
            for r in recs:
                for e in r.get("expect", []):
                    if e["detector"] not in seen and not r["healthy"] and (source == "samples" or not keep):
                        seen.add(e["detector"])
                        keep.update({r["file"], r.get("twin", "")})
            recs = [r for r in recs if r["file"] in keep]
        out += [(source, manifest.parent / r["file"], r) for r in recs]
    return out


def rocev2_records(quick: bool, only) -> list[tuple[str, float, int]]:
    """(scenario, scale, seed) of every generated RoCEv2 capture to score."""
    out = []
    for name in rc.scenarios():
        if quick and (rc.twin_of(name) or name) not in ROCEV2_QUICK:
            continue
        if only and name not in only:
            continue
        scales = (ROCEV2_QUICK_SCALE,) if quick else ROCEV2_SCALES_OF.get(name, ROCEV2_SCALES)
        out += [(name, scale, seed) for scale in scales for seed in (ROCEV2_SEEDS[:1] if quick else ROCEV2_SEEDS)]
    return out


def evaluate(opts) -> dict:
    t_start = time.perf_counter()
    detectors = list(available())
    results: list[dict] = []
    work = Path(opts.keep) if opts.keep else Path(tempfile.mkdtemp(prefix="herdscope-eval-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not opts.no_real:
            for source, path, record in real_records(opts.quick):
                if opts.only and record["file"] not in opts.only and record.get("scenario") not in opts.only:
                    continue
                findings, first, errors = analyse(path)
                results.append({"source": source, **judge(record, findings, first, errors, opts),
                                "curve": curve_of(record, source)})
                progress(opts, results[-1])
        records = []
        if not opts.no_synthetic:
            for scn in sc.scenarios(opts.quick, opts.only):
                record = sc.write(scn, str(work))
                records.append(record)
                path = work / record["file"]
                findings, first, errors = analyse(path)
                res = {"source": "synthetic", **judge(record, findings, first, errors, opts),
                       "curve": curve_of(record, "synthetic")}
                results.append(res)
                progress(opts, res)
                if not opts.keep:
                    path.unlink()
        if not opts.no_rocev2:
            for name, scale, seed in rocev2_records(opts.quick, opts.only):
                findings, first, errors = analyse(rc.rocev2_capture(name, scale, seed))
                record = rc.record(name, scale, seed, detectors, first)
                results.append({"source": "rocev2", **judge(record, findings, first, errors, opts),
                                "scenario": record["scenario"], "scale": record["scale"], "seed": record["seed"],
                                "curve": None})
                progress(opts, results[-1])
        if opts.keep:
            (work / "MANIFEST.json").write_text(json.dumps({"capture": records}, indent=1))
        mixed = mixed_run(opts.mixed, work) if opts.mixed else None
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    return {"detectors": detectors, "severity": opts.severity, "healthy_severity": opts.healthy_severity,
            "quick": opts.quick, "confusion": tally(results, detectors),
            "by_source": {s: tally([r for r in results if r["source"] == s], detectors)
                          for s in sorted({r["source"] for r in results})},
            "curves": curves(results), "captures": results, "mixed": mixed,
            "elapsed_s": round(time.perf_counter() - t_start, 1)}


def progress(opts, r: dict) -> None:
    if opts.verbose:
        print(f"  {r['source']:9} {r['file']}: {r['findings_medium']} >= medium", file=sys.stderr, flush=True)


# -- printing --------------------------------------------------------------------------------------

def confusion_lines(table: dict[str, dict[str, int]], title: str) -> list[str]:
    w = max([16, *(len(d) + 1 for d in table)])
    head = f"{'detector':{w}}" + "".join(f"{c:>7}" for c in COLUMNS)
    lines = [title, head, "-" * len(head)]
    total = dict.fromkeys(COLUMNS, 0)
    for d, row in table.items():
        lines.append(f"{d:{w}}" + "".join(f"{row[c]:>7}" for c in COLUMNS))
        for c in COLUMNS:
            total[c] += row[c]
    lines.append(f"{'all':{w}}" + "".join(f"{total[c]:>7}" for c in COLUMNS))
    return lines


def secs(x: float) -> str:
    """A time after the first packet: seconds, or milliseconds below one second (the RoCEv2 runs)."""
    return f"{x:.2f} s" if abs(x) >= 1 else f"{x * 1e3:.3f} ms"


def rocev2_lines(captures: list[dict]) -> list[str]:
    """Per RoCEv2 scenario, per (scale, seed): labels found / labels, and false alarms by detector."""
    by: dict[str, list[str]] = {}
    for r in captures:
        if r["source"] != "rocev2":
            continue
        hit = sum(e["hit"] for e in r["expects"])
        fa = ",".join(sorted({f["detector"] for f in r["false_alarms"]}))
        found = f"{hit}/{len(r['expects'])}" if r["expects"] else "" if fa else "clean"
        verdict = found + (f" FA {fa}" if fa else "")
        by.setdefault(r["scenario"], []).append(f"x{r['scale']:g}/s{r['seed']} {verdict}")
    if not by:
        return []
    return ["", "RoCEv2 (generated; per scale/seed: labels found/labels, clean = nothing from a silent detector, "
                "FA = silent detectors that reported)"] + [
        f"  {name:28} " + "  ".join(cells) for name, cells in by.items()]


def report(res: dict) -> str:
    n = len(res["captures"])
    per = ", ".join(f"{s} {sum(1 for r in res['captures'] if r['source'] == s)}" for s in res["by_source"])
    lines = [f"herdscope evaluation: {n} captures ({per}), {res['elapsed_s']} s{' (quick)' if res['quick'] else ''}",
             f"TP/miss at >= medium; FA: silent detector >= {res['severity']} on a pathological capture, "
             f"anything >= {res['healthy_severity']} on a healthy one; h_med: healthy with a medium; "
             f"count: TP with the wrong number of findings", ""]
    unread = [r["file"] for r in res["captures"] if "open_capture" in r["errors"]]
    if unread:
        lines[-1:-1] = [f"UNREADABLE (not scored): {', '.join(unread)}"]
    if n:
        lines += confusion_lines(res["confusion"], "All captures")
    for source, table in res["by_source"].items():
        lines += [""] + confusion_lines(table, f"Source: {source}")
    problems = []
    for r in res["captures"]:
        for e in r["expects"]:
            if e["pathology"] is not None and not e["hit"]:
                problems.append(f"  miss  {r['file']}: {e['detector']}/{e['kind'] or '?'} at {secs(e['start_s'])} "
                                f"(worst there: {e['near_worst'] or 'nothing'})")
            elif e["pathology"] is not None and not e["count_ok"]:
                problems.append(f"  count {r['file']}: {e['detector']} {e['hits']} findings for one episode")
        for fa in r["false_alarms"]:
            problems.append(f"  FA    {r['file']}: {fa['detector']} {fa['findings']} x {'/'.join(fa['kinds'])}, "
                            f"worst {fa['worst']}")
        for d, err in r["errors"].items():
            problems.append(f"  err   {r['file']}: {d}: {err}")
    if problems:
        lines += ["", "Misses, false alarms, counts and errors:"] + problems
    lines += rocev2_lines(res["captures"])
    if res["curves"]:
        lines += ["", "Operating curves (per point the worst matching finding: - none, I L M H C; * healthy point;"
                      " fires = M or worse)"]
        for c in res["curves"]:
            pts = " ".join(f"{p['value']:g}{'*' if p['healthy'] else ''}:{SEV_LETTER[p['worst']]}" for p in c["points"])
            first = "never" if c["first_fires"] is None else f"{c['first_fires']:g}"
            way = "smallest" if c["direction"] == "up" else "largest"
            fa = f"; healthy firing at {', '.join(f'{v:g}' for v in c['healthy_fires'])}" if c["healthy_fires"] else ""
            lines.append(f"  {c['sweep']:28} {c['detector'] or '?':11} {c['param']:11} {pts}  -> {way} firing: "
                         f"{first}{fa}")
    if res["mixed"]:
        m = res["mixed"]
        g = m["generate"]
        lines += ["", f"Large mixed capture: {g['packets']} packets, {g['losses']['syn']} SYN and "
                      f"{g['losses']['tail']} tail losses on {g['servers_with_losses']} services (generated "
                      f"{m['generate_s']} s, analysed {m['analyse_s']} s): {m['findings']} findings, "
                      f"{m['findings_medium']} >= medium"]
        lines += [f"  {x['detector']}/{x['kind']} {x['severity']}: {x['n']}" for x in m["medium_by"]]
        lines.append("  synth.py's labels (worst finding of their detector over the episode): " + ", ".join(
            f"{x['detector']} {SEV_LETTER[x['worst']]}{'' if x['found'] else ' (below medium)'}"
            for x in m["labels_found"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (seconds, not minutes)")
    ap.add_argument("--json", metavar="OUT", help="write the whole result as JSON")
    ap.add_argument("--keep", metavar="DIR", help="keep the generated captures (and MANIFEST.json) in DIR")
    ap.add_argument("--only", nargs="*", help="capture files, scenario names or sweep names")
    ap.add_argument("--no-real", action="store_true", help="skip samples/ and samples/eval/")
    ap.add_argument("--no-synthetic", action="store_true", help="skip the synthetic sweeps")
    ap.add_argument("--no-rocev2", action="store_true", help="skip the generated RoCEv2 scenarios")
    ap.add_argument("--mixed", type=int, metavar="PACKETS", help="also the large mixed capture with losses")
    ap.add_argument("--severity", default="medium", choices=SEVERITIES, help="false alarm bar (default medium)")
    ap.add_argument("--healthy-severity", default="high", choices=SEVERITIES,
                    help="false alarm bar on healthy captures (default high)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per capture on stderr")
    opts = ap.parse_args(argv)
    if opts.mixed is not None and opts.mixed < sc.S.MIN_PACKETS:
        ap.error(f"--mixed needs at least {sc.S.MIN_PACKETS} packets")
    try:
        res = evaluate(opts)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 4
    print(report(res))
    if opts.json:
        Path(opts.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
