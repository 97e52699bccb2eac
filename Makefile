# herdscope: `make demo` and `make test` are all a fresh Debian machine with Python needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.herdscope-installed
DEMO_CAPTURE ?= samples/smb2-break-queue.pcap
# warming the Numba cache at set-up compiles every decoder's kernels: a capture with each protocol
WARM_CAPTURES ?= samples/dns-ttl-herd.pcap samples/krb5-as-tgs-herd.pcapng samples/ldap-conn-churn.pcap
SUDO   ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo dashboard screenshot test test-all bench eval samples clean

$(STAMP): pyproject.toml
	@if ! $(PYTHON) -c 'import venv, ensurepip' 2>/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing python3-venv (Debian's Python ships venv separately)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; \
	  else echo "herdscope needs Python's venv module: sudo apt-get install python3-venv" >&2; exit 1; fi; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@# bytecode of herdscope's own modules: an editable install writes none, and where PYTHONDONTWRITEBYTECODE
	@# is set (CI images) every start would compile ~100 modules again (~0.3 s of a scan's fixed cost)
	$(BIN)/python -m compileall -q analyzer detectors dashboards
	@echo "compiling herdscope's analysis kernels once (about a minute; later runs load them from the cache)"
	$(BIN)/herdscope scan --quiet --separate $(DEMO_CAPTURE) $(WARM_CAPTURES) || [ $$? -eq 1 ]
	@touch $(STAMP)

setup: $(STAMP)

# A real Samba capture: one client sits 3 s on an oplock break while four others queue behind it.
# scan exits 1 when it finds something at or above --fail-on (high); for the demo that is the point.
demo: setup
	$(BIN)/herdscope info $(DEMO_CAPTURE)
	$(BIN)/herdscope stats $(DEMO_CAPTURE)
	$(BIN)/herdscope scan $(DEMO_CAPTURE) || [ $$? -eq 1 ]

dashboard: setup
	$(BIN)/herdscope dashboard $(DEMO_CAPTURE)

# Refreshes dashboards/screenshot.png (the README's picture); needs Debian's chromium.
screenshot: setup
	HERDSCOPE_UPDATE_SCREENSHOT=1 $(BIN)/python -m pytest -q tests/test_dashboard_browser.py

# on every core (pytest-xdist); TEST_WORKERS=0 runs in one process
TEST_WORKERS ?= auto
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# Also the slow tests (large generated captures).
test-all: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not real_samples"

# BENCH_ARGS="--packets 10000000" for the 10M-packet capture (generated once into .bench/, 6.3 GB).
BENCH_ARGS ?=
bench: setup
	$(BIN)/python tests/benchmarks/bench.py $(BENCH_ARGS)

# The evaluation: every detector over the real-server samples and the synthetic sweeps of
# samples/synth_scenarios.py: confusion table and operating curves (a few minutes).
# EVAL_ARGS="--quick" for a subset; "--mixed 1000000" adds the large mixed capture with losses.
EVAL_ARGS ?=
eval: setup
	$(BIN)/python tests/benchmarks/evaluate.py $(EVAL_ARGS)

# Rebuild the real-server captures (root + Debian packages, ~6 min; never in CI). See samples/README.md.
samples: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[samples]'
	$(SUDO) $(BIN)/python samples/make_real.py --out samples/

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .bench tests/artifacts
	find analyzer detectors dashboards tests -name __pycache__ -type d -prune -exec rm -rf {} +
