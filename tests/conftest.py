import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/builders.py, tests/tshark_ref.py

DATA = os.path.join(os.path.dirname(__file__), "data")


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
