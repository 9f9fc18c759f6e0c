# `make test` and `make demo` set up everything they need in .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The JAX core (what `make demo` needs: no PyTorch, about 1 GB), then the test extras on top.
CORE_STAMP := $(VENV)/.core-installed
STAMP := $(VENV)/.installed
# PyTorch for the parity references. torchvision (needed by open_clip) must match it;
# on aarch64 use TORCH_SPEC="torch==2.9.1 torchvision==0.24.1".
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# Locally `make test` skips tests marked slow; CI (CI=true) runs them all.
PYTEST_MARK := $(if $(filter true 1,$(CI)),,-m "not slow")
# Tests run on two worker processes (pytest-xdist; each test file's tests may land on either):
# on 2 CPU cores the suite is mostly XLA compiles, one core each. PYTEST_WORKERS=0 runs one.
PYTEST_WORKERS ?= 2
PYTEST_ARGS := -n $(PYTEST_WORKERS) --dist worksteal --durations=10
# The tests' persistent compilation cache, kept in this clone between runs (tests/conftest.py):
# a second `make test` reads the programs the first compiled rather than compiling them again.
# A clean clone (CI's) starts it empty. STORI_TEST_COMPILATION_CACHE=0 turns it off.
TEST_CACHE := $(CURDIR)/.cache/test-compilation

.PHONY: test test-all demo readme-figures install clean

$(CORE_STAMP): setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP) setup.py
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[torch,test]"
	# SimpleCRF, the reference's dense CRF (tests of mutual/reference.py), has only a source
	# release, which builds against numpy 2 only with this define (about 2 minutes). Without it
	# those tests run the reference pipeline with the CRF off and say so.
	CPPFLAGS="-DNPY_IN_ARRAY=NPY_ARRAY_IN_ARRAY" $(PY) -m pip install -q "SimpleCRF==0.2.1.1" \
	  || echo "WARNING: SimpleCRF did not build; the reference-pipeline tests run without its CRF."
	touch $(STAMP)

install: $(STAMP)

test test-all: export STORI_TEST_COMPILATION_CACHE ?= $(TEST_CACHE)

# Progress, then the ten slowest tests and every skip reason.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) $(PYTEST_MARK)

test-all: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The main job on the embedded default: few-shot SToRI on the synthetic world (offline).
demo: $(CORE_STAMP)
	$(PY) -m stori_jax.train --config configs/demo.py --workdir workdirs/demo

# Re-measures the embedded-world figures of README.md and docs/*.md and rewrites their marked
# regions in place, wherever each lives (several minutes on 2 CPU cores). FIGURES_FLAGS="--check"
# only diffs; "--only demo,world" picks.
readme-figures: $(STAMP)
	$(PY) scripts/readme_figures.py $(FIGURES_FLAGS)

clean:
	rm -rf $(VENV) *.egg-info .cache
