# `make test` and `make demo` each set up .venv (Python 3.11, exact pins) first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-all demo fuzz clean

$(STAMP): requirements.txt constraints.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m codec_tosa.runtime.native build
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# the long fuzz profile (issue 6): about FUZZ_EXAMPLES compiled random modules
FUZZ_EXAMPLES ?= 300
fuzz: $(STAMP)
	CODEC_TOSA_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:logging \
		--hypothesis-show-statistics tests/test_fuzz.py

demo: $(STAMP)
	$(VENV)/bin/codec-tosa demo

clean:
	rm -rf $(VENV) build *.egg-info
