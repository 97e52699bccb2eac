"""What ``herdscope dashboard`` hands the app, passed as JSON in ``$HERDSCOPE_DASHBOARD`` (this module
imports no Streamlit: the launcher uses it before Streamlit starts)."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

ENV = "HERDSCOPE_DASHBOARD"
REPO_SAMPLES = Path(__file__).resolve().parent.parent / "samples"


@dataclass(frozen=True)
class Settings:
    """What ``herdscope dashboard`` hands the app."""

    files: tuple[str, ...] = ()  # captures to load (absolute paths)
    browse_root: str = field(default_factory=os.getcwd)  # the path field may read only under this
    max_upload_mb: int = 200  # shown to the user; Streamlit enforces it (server.maxUploadSize)
    samples_dir: str | None = None  # bundled samples (default: samples/ next to the package)

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Settings":
        raw = (environ if environ is not None else os.environ).get(ENV)
        if not raw:
            return cls()
        doc = json.loads(raw)
        doc["files"] = tuple(doc.get("files") or ())
        return cls(**{k: v for k, v in doc.items() if k in {f.name for f in dataclasses.fields(cls)}})

    @property
    def samples(self) -> Path:
        return Path(self.samples_dir) if self.samples_dir else REPO_SAMPLES
