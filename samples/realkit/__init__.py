"""Helpers for samples/make_real.py: network namespaces, servers, captures, ground truth.

Everything here runs as root on Debian and touches only network namespaces whose names start
with ``hsreal-`` (created and removed by this package), processes it started itself, and a
temporary directory.
"""
