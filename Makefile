# `make test` and `make demo` set up everything they need in .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# PyTorch for the parity references. torchvision (needed by open_clip) must match it;
# on aarch64 use TORCH_SPEC="torch==2.9.1 torchvision==0.24.1".
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# Locally `make test` skips tests marked slow; CI (CI=true) runs them all.
PYTEST_MARK := $(if $(filter true 1,$(CI)),,-m "not slow")

.PHONY: test test-all demo readme-figures install clean

$(STAMP): setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[torch,test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_MARK)

test-all: $(STAMP)
	$(PY) -m pytest -q

# The main job on the embedded default: few-shot SToRI on the synthetic world (offline).
demo: $(STAMP)
	$(PY) -m stori_jax.train --config configs/demo.py --workdir workdirs/demo

# Re-measures the README's embedded-world figures and rewrites their marked regions in place
# (several minutes on 2 CPU cores). FIGURES_FLAGS="--check" only diffs; "--only demo,world" picks.
readme-figures: $(STAMP)
	$(PY) scripts/readme_figures.py $(FIGURES_FLAGS)

clean:
	rm -rf $(VENV) *.egg-info
