# mneme — the two commands of the README set everything up on a fresh Debian 12 machine:
#   make demo    the main job (record/replay/tune on a GPU; the compile-only experiment without one)
#   make test    the CPU test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CUDA_HOME ?= /usr/local/cuda
CLANG ?= clang++-22
K ?=
export CUDA_HOME

.PHONY: setup system-packages native ptx examples test demo gpu-bundle gpu-check fixtures bench corpus clean

# ---- setup ------------------------------------------------------------------------------
setup: $(VENV)/.installed native

system-packages:
	@bash scripts/system-packages.sh

$(VENV)/.installed: pyproject.toml
	@$(MAKE) --no-print-directory system-packages
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The cffi extension (snapshot format + replay core), the LD_PRELOAD recorder and applier, and the in-process
# ptxas (nvPTXCompiler linked into mneme/lib/libmneme_ptxc.so where a static archive of ptxas's version exists).
native: $(VENV)/.installed
	$(PY) native/build_native.py
	$(MAKE) --no-print-directory -C native/recorder CUDA_HOME=$(CUDA_HOME) OUT=$(CURDIR)/mneme/lib
	$(MAKE) --no-print-directory -C native/apply CUDA_HOME=$(CUDA_HOME) OUT=$(CURDIR)/mneme/lib
	$(PY) native/ptxcompiler/build_ptxcompiler.py

# The GPU compare kernel ships as PTX (mneme/data/compare.ptx); regenerate it after editing compare.cu.
ptx:
	bash native/core/build_ptx.sh

examples: setup
	$(MAKE) -C examples MNEME="$(CURDIR)/$(VENV)/bin/mneme" CXX="$(CURDIR)/$(VENV)/bin/mneme cc"

# ---- tests --------------------------------------------------------------------------------
# Exit code 5 (nothing collected) is a failure too: a suite that runs nothing proves nothing.
test: setup
	$(PY) -m pytest -q -m "not gpu" $(if $(K),-k "$(K)") tests

# On a GPU machine prepared with `make gpu-bundle` (no clang, no registry there): bash scripts/demo.sh
demo: setup
	bash scripts/demo.sh

# ---- the GPU machine (see docs/GPU.md) --------------------------------------------------------
# Here: cp312 wheels for what the GPU machine lacks, and the examples built with clang-22.
gpu-bundle: setup
	bash scripts/gpu-bundle.sh

# There: install from the bundle, build the native parts, record, run the gpu tests, one summary line.
gpu-check:
	bash scripts/gpu-check.sh $(if $(K),"$(K)")

fixtures:
	bash scripts/fixtures.sh

bench:
	bash scripts/bench.sh $(PART)

# The corpus campaign (docs/GPU.md): make corpus STAGE=build|plan|pack|plain|record|replay|tune|ncu|merge APPS=a,b
STAGE ?= build
corpus:
	bash scripts/corpus.sh $(STAGE) $(if $(APPS),--apps $(APPS))

clean:
	rm -rf mneme/_native*.so mneme/lib build examples/bin examples/obj
