# Two set-up commands for a fresh machine: `make demo` and `make test`. Each builds .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo

.PHONY: demo demo-next test test-quick test-all venv clean

# torch's CPU build on every machine, GPU or not: PyPI's Linux torch is a CUDA build (several GB of
# CUDA libraries), the CPU build is 2.13.0+cpu on PyTorch's CPU index (macOS: PyPI's torch is the CPU one).
TORCH := $(if $(filter Darwin,$(shell uname -s)),torch==2.13.0,torch==2.13.0+cpu)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
PYTHON_CHECK := import sys; sys.exit(None if sys.version_info >= (3, 11) else \
	"fastload needs Python 3.11 or newer; $(PYTHON) is %d.%d: run make PYTHON=python3.11 (or newer)" % sys.version_info[:2])

# One venv; the demo installs only what it runs (the plot extra), the tests the dev extra.
$(VENV)/.installed-%: setup.cfg setup.py pyproject.toml fastload/decode/*.c fastload/decode/*.h
	@$(PYTHON) -c '$(PYTHON_CHECK)'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The pinned CPU torch first (an unpinned one would pull several GB of CUDA packages): a wheel pip
	# finds already (a local cache in its find-links) when there is one, else from PyTorch's CPU index.
	$(PY) -m pip install --quiet "$(TORCH)" 2>/dev/null || \
		$(PY) -m pip install --quiet "$(TORCH)" --extra-index-url $(TORCH_CPU_INDEX)
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
	@$(MAKE) --no-print-directory demo-next

# What to type next: `fastload` is in .venv/bin, not on a fresh shell's PATH (tests/test_readme.py runs
# these lines in a shell without the venv, as printed).
demo-next:
	@echo
	@echo "Next: put .venv's fastload and python on this shell's PATH, then pack a folder (the demo's"
	@echo "images here; your own in their place), look at it, check it:"
	@echo
	@echo "  cd $(CURDIR)"
	@echo "  . $(VENV)/bin/activate"
	@echo "  fastload pack $(DEMO)/images -o images.fl"
	@echo "  fastload info images.fl"
	@echo "  fastload verify images.fl --decode"
	@echo
	@echo "Or without activating: $(VENV)/bin/fastload info $(DEMO)/images.fl"
	@echo "Then the Python quick start in README.md, run with python from the activated venv."

# The whole suite but the long reliability tests (what CI runs), in two processes: many tests wait
# on servers, clusters, subprocesses or deadlines rather than a core, and test modules share their
# servers and data, so each module runs whole in one process (--dist loadfile). TEST_PROCESSES=1:
# one process, as before (~16 min on a quiet 2-core machine against ~12).
TEST_PROCESSES ?= 2
XDIST = $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)
test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not reliability" $(XDIST)

# About 4 minutes while you work: the suite less the tests that start servers, clusters, DDP ranks or
# timed benchmark runs, and less the docs build. `make test` before you commit.
QUICK_SKIP := tests/remote tests/cluster tests/benchmark tests/backends tests/reliability \
	tests/test_docs.py tests/test_snippets.py tests/loading/test_distributed.py tests/loading/test_elastic.py
test-quick: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not reliability and not slow" $(addprefix --ignore=,$(QUICK_SKIP))

test-all: $(VENV)/.installed-dev
	$(PY) -m pytest -q $(XDIST)

clean:
	rm -rf $(VENV) $(DEMO)
