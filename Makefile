# `make test` and `make demo` each set up .venv (Python 3.11, exact pins) first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-slow test-all tiers demo fuzz peer clean

# Debian packages: the VGF target's (lavapipe and the Vulkan loader), zlib's headers
# for the C++ runtime backend (external weights' deflated skeletons)
APT_PACKAGES := mesa-vulkan-drivers libvulkan1 zlib1g-dev

$(STAMP): requirements.txt requirements/*.txt constraints.txt setup.py
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing $$missing (VGF target)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "the VGF target needs Debian packages: $$missing (sudo apt-get install $$missing)"; \
	  fi; \
	fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m codec_tosa.runtime.native build
	touch $(STAMP)

setup: $(STAMP)

# both cores, one torch thread each; idle workers steal queued tests (a few files
# hold most of the time); the 15 slowest are listed at the end. `make test` leaves
# out the tests marked slow (big models, the full retrain, the fuzz grid's
# non-default placements, and those tests/slow_tests.txt lists as measured dear);
# `make test-slow` runs those, `make test-all` both; CI runs test, then test-slow
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist worksteal --durations=15
test: $(STAMP)
	$(PYTEST) -m "not slow"

# regenerate tests/slow_tests.txt from a timed run of the default tier (run it again
# until it adds nothing: tests/support/slow_tests.py)
tiers: $(STAMP)
	$(PYTEST) -m "not slow" --junitxml=.tiers.xml -p no:warnings || true
	$(PY) tests/support/slow_tests.py .tiers.xml && rm -f .tiers.xml

test-slow: $(STAMP)
	$(PYTEST) -m slow

test-all: $(STAMP)
	$(PYTEST)

# the long fuzz profile (issue 6): about FUZZ_EXAMPLES compiled random modules,
# in two single-threaded processes (one per core), logs in fuzz-*.log; each
# passing example is recorded in fuzz-results.jsonl and summarised at the end
FUZZ_EXAMPLES ?= 300
# each compiled example is validated on its example input and this many held-out samples
FUZZ_SAMPLES ?= 16
# (-k is case-insensitive: "I-" also matches no other test id here)
FUZZ_SHARDS := "Z- or Y- or V- or analysis or wires or recipes" "X- or W- or I-"
fuzz: $(STAMP)
	@rm -f fuzz-results.jsonl; pids=; n=0; for k in $(FUZZ_SHARDS); do n=$$((n+1)); \
	  echo "fuzz shard $$n: -k $$k (log fuzz-$$n.log)"; \
	  CODEC_TOSA_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) CODEC_TOSA_FUZZ_SAMPLES=$(FUZZ_SAMPLES) CODEC_TOSA_FUZZ_RECORD=$(CURDIR)/fuzz-results.jsonl \
	    OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:logging --hypothesis-show-statistics \
	    tests/fuzz/test_fuzz.py -k "$$k" > fuzz-$$n.log 2>&1 & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for f in fuzz-*.log; do echo "$$f: $$(tail -n 1 $$f)"; done; \
	$(PY) benchmarks/fuzz_summary.py fuzz-results.jsonl --json benchmarks/results/fuzz.json; exit $$rc

# Arm's own operator tests as our robustness suite (tests/peer): every case at W
# and I against the stock verdicts in tests/peer/stock_baseline.json (hours;
# PEER_ARGS="--per-operator 1" for one case per operator, about an hour); then
# Arm's model tests beside stock (benchmarks/arm_models.py, about 40 minutes)
PEER_ARGS ?= --all
peer: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/peer.py $(PEER_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/arm_models.py

demo: $(STAMP)
	$(VENV)/bin/codec-tosa demo

clean:
	rm -rf $(VENV) build *.egg-info
