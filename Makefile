# Two commands on a fresh machine (as root, network to the package registries only):
#   make demo   install what is missing, then run the main job on built-in data
#   make test   install what is missing, then run the test suite
# Second runs skip what is done (the venv and a stamp file record it).
#   make docs   the documentation site in build/site (strict; runs the examples for the gallery)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.sparsedp-installed
SUITESPARSE_HEADER := /usr/include/suitesparse/cholmod.h

.PHONY: demo test install bench docs clean

demo: $(STAMP)
	$(PY) -m sparsedp demo

test: $(STAMP)
	$(PY) -m pytest -q

install: $(STAMP)

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

docs: $(STAMP)
	$(PY) docs/build.py

$(PY):
	$(PYTHON) -m venv $(VENV)

$(SUITESPARSE_HEADER):
	@if [ "$$(id -u)" = "0" ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y libsuitesparse-dev; \
	else \
		echo "libsuitesparse-dev is missing: run 'sudo apt-get install -y libsuitesparse-dev' (needed by scikit-sparse)"; exit 1; \
	fi

$(STAMP): pyproject.toml | $(PY) $(SUITESPARSE_HEADER)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[cholmod,dev,plot,roads,io,docs,scale,data]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
