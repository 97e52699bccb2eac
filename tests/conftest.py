import os
import sys

import pytest
from hypothesis import settings

# CI runs the same examples every time (a red build must mean a change broke something); developers
# hunting for new failures run with HYPOTHESIS_PROFILE=explore.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

sys.path.insert(0, os.path.dirname(__file__))  # tests/builders.py, tests/tshark_ref.py

# Output tests compare what a pipe gets (rich's PIPE_WIDTH); pytest-xdist's workers inherit a COLUMNS
# of 80 that a terminal would not give them. Tests about COLUMNS set it themselves (monkeypatch).
os.environ.pop("COLUMNS", None)

DATA = os.path.join(os.path.dirname(__file__), "data")


def pytest_sessionfinish(session, exitstatus):
    """Close the captures tests/shared_captures.py kept open for the session."""
    import shared_captures

    shared_captures.close_all()


@pytest.fixture
def read_capture(tmp_path):
    """Write bytes to a file and read it: returns the Capture (closed at teardown)."""
    from analyzer import open_capture

    opened = []

    def read(data: bytes, name="t.pcap", **options):
        path = tmp_path / name
        path.write_bytes(data)
        cap = open_capture(path, **options)
        opened.append(cap)
        return cap

    yield read
    for cap in opened:
        cap.close()


@pytest.fixture(scope="session")
def synthetic_capture(tmp_path_factory):
    """``samples/synth.py --packets 200000 --seed 3``, generated once per session (its labels are in
    ``<path>.labels.json``). For the tests that check detectors find the synthetic pathologies (tests/synthetic.py)."""
    import subprocess
    from pathlib import Path

    out = tmp_path_factory.mktemp("synth") / "synth-200k-s3.pcap"
    root = Path(__file__).parent.parent
    subprocess.run([sys.executable, str(root / "samples" / "synth.py"), "--packets", "200000", "--seed", "3",
                    "--out", str(out), "--quiet"], check=True, capture_output=True, timeout=600)
    return out

