# Two set-up commands for a fresh machine: `make demo` and `make test`. Each builds .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo

.PHONY: demo test test-all venv clean

# One venv; the demo installs only what it runs (the plot extra), the tests the dev extra.
$(VENV)/.installed-%: setup.cfg setup.py pyproject.toml fastload/decode/*.c fastload/decode/*.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The pinned CPU torch first: an unpinned one would pull several GB of CUDA packages.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[$*]"
	touch $@

venv: $(VENV)/.installed-dev

demo: $(VENV)/.installed-plot
	$(PY) bench/make_example.py $(DEMO)/images --count 600 --classes 6 --overwrite
	$(VENV)/bin/fastload pack $(DEMO)/images -o $(DEMO)/images.fl --overwrite
	$(VENV)/bin/fastload info $(DEMO)/images.fl
	$(VENV)/bin/fastload verify $(DEMO)/images.fl
	# About a minute: torch ImageFolder vs fastload on the same 600 images, 3 interleaved runs per row
	# (median, min-max), stage timings and a verdict.
	$(VENV)/bin/fastload bench $(DEMO)/images --packed $(DEMO)/images.fl --stages \
		--plot $(DEMO)/bench.png --json $(DEMO)/bench.json

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not reliability"

test-all: $(VENV)/.installed-dev
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO)
