# tilefuse: two commands do everything on a fresh machine.
#   make demo   creates .venv, installs, runs the main job (on Triton's interpreter when there is no GPU)
#   make test   creates .venv, installs, runs the whole suite that can run without a GPU
# On a GPU machine (nothing can be installed there) the system python runs:
#   make gpu-test   the tests marked `gpu`
#   make bench      the benchmark suites, CSV under benchmarks/results/

VENV      ?= .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.tilefuse-installed
SYSPY     ?= python3
# torch 2.13.0 is the CPU wheel on the dev/CI machines' disk; triton 3.6.0 is the GPU machine's version;
# numpy stays below 2.4 because Triton 3.6's interpreter fails on numpy 2.4+.
# transformers 5.17.0: the Hugging Face families of the real-model suite (tests/test_real_models.py).
DEPS      := torch==2.13.0 triton==3.6.0 "numpy<2.4" pytest pytest-xdist hypothesis matplotlib transformers==5.17.0
PYTEST_JOBS ?= 2

.PHONY: demo test test-fast gpu-test bench targets clean deps

# System packages the tests need: clang-19 compiles the HIP translation of the CUDA C++ ladder for gfx90a and
# gfx942 (compile-only). Installed with apt where apt can (root, or passwordless sudo); elsewhere the tests
# that need it skip, saying so. CI (.ci/run) runs this same step through `make test`.
deps:
	@if command -v clang-19 >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null; }; then \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  echo "installing clang-19 (HIP compile-only tests) with apt-get"; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q clang-19; \
	else \
	  echo "note: clang-19 is not installed and apt-get cannot install it here: the HIP compile tests will skip"; \
	fi

$(STAMP): pyproject.toml
	$(MAKE) --no-print-directory deps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(DEPS)
	$(PY) -m pip install -q --no-deps -e .
	touch $@

demo: $(STAMP)
	$(PY) -m tilefuse demo

test: $(STAMP) deps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_JOBS) --dist loadgroup

targets: $(STAMP)
	$(PY) -m tilefuse targets

gpu-test:
	PYTHONPATH=$(CURDIR) $(SYSPY) -m pytest -q -m gpu

bench:
	PYTHONPATH=$(CURDIR) $(SYSPY) -m tilefuse info --measure
	PYTHONPATH=$(CURDIR) $(SYSPY) -m tilefuse bench gemm ladder compiler --out benchmarks/results

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
