# placer — the two commands a new user needs:
#   make demo   set up, then place (auto, the default optimizer) | simulate a bundled sample graph and print
#               the result table
#   make test   set up, then run the test suite
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
GRAPH   ?= sample_graphs/zoo/transformer.json.gz
CLUSTER ?= sample_graphs/clusters/4xV100-pcie.json
ALGO    ?= auto

.PHONY: install install-torch install-ray install-browser demo test test-all bench samples clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# torch is an optional extra (placer profile from real models, the hierarchical planner)
$(VENV)/.torch: | $(VENV)/.installed
	$(BIN)/python -m pip install -q 'torch==2.13.0'
	touch $@

install-torch: $(VENV)/.torch

# Ray is an optional extra (placer compare --executor ray); CI installs it (.ci/run) so the Ray tests run
$(VENV)/.ray: pyproject.toml | $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[ray]'
	touch $@

install-ray: $(VENV)/.ray

# the slow browser test of the HTML pages (tests/report/test_browser.py): playwright and Debian's chromium
install-browser: | $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[browser]'
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

demo: install
	@mkdir -p out
	$(BIN)/placer place $(GRAPH) --algo $(ALGO) --cluster $(CLUSTER) -o out/demo_placement.json
	$(BIN)/placer simulate $(GRAPH) --cluster $(CLUSTER) --placement out/demo_placement.json \
	  --format table --gantt out/demo_gantt.svg -o out/demo_report.json
	@echo "placement: out/demo_placement.json  report: out/demo_report.json  Gantt chart: out/demo_gantt.svg"

test: install install-torch
	$(BIN)/python -m pytest -m "not slow" tests celeritas_cli

test-all: install install-torch
	$(BIN)/python -m pytest tests celeritas_cli

bench: install
	$(BIN)/python benchmarks/run.py

samples: install install-torch
	$(BIN)/python scripts/make_samples.py

clean:
	rm -rf $(VENV) out .pytest_cache build *.egg-info
