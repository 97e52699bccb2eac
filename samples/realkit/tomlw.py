"""A small TOML writer for MANIFEST.toml (the standard library only reads TOML)."""
from __future__ import annotations

import math


def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise ValueError(v)
        return repr(round(v, 6))
    if isinstance(v, str):
        s = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{s}"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v)} to TOML")


def _scalars(d: dict, indent: str) -> list[str]:
    return [f"{indent}{k} = {_val(v)}" for k, v in d.items()
            if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))]


def dump_manifest(captures: list[dict], header: str) -> str:
    """captures: dicts with scalar keys, sub-dicts (tables) and 'expect' (list of dicts)."""
    out = [header.rstrip(), ""]
    for c in captures:
        out.append("[[capture]]")
        out += _scalars(c, "")
        for k, v in c.items():
            if isinstance(v, dict):
                out.append(f"  [capture.{k}]")
                out += _scalars(v, "  ")
        for e in c.get("expect", []):
            out.append("  [[capture.expect]]")
            out += _scalars(e, "  ")
            for k, v in e.items():
                if isinstance(v, dict):
                    out.append(f"  [capture.expect.{k}]")
                    out += _scalars(v, "  ")
        out.append("")
    return "\n".join(out) + "\n"
