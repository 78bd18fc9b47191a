# Two commands do all the set-up on a fresh machine:
#   make demo   venv + vLLM CPU engine + tiny model, then a real sweep (sweeps/quickstart.yaml)
#   make test   the same environment, then the checks and every test (what CI runs via .ci/run)
# and one for the edit loop:
#   make check  ruff, the import-linter layer contracts, mypy, and tests/unit (no server, no Ray)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.vllm-sweep-installed
MODEL := models/tiny-llama
SWEEP ?= sweeps/quickstart.yaml
# Tests run in LANES pytest-xdist lanes, a whole file per lane at a time, costliest files first
# (tests/lanes.py, tests/durations.json): one lane leaves about half of this machine's two cores
# idle (docs/BENCHMARKS.md, "Test-suite cost, session 12"). A file's tests share its lane's
# session fixtures (the shared vLLM server, the shared Ray), so each lane starts its own.
LANES ?= 2
IN_LANES := -n $(LANES) --dist loadfile --no-loadscope-reorder
# `make test` adds WAIT_LANES lanes beside the LANES: they run the files that mostly wait on
# wall-clock events first (tests/lanes.py: core-seconds at most 0.55 of their seconds, from the
# CPU ledger's `cores` in tests/durations.json), then those that need the CPU least (up to 0.7),
# so no CPU-bound file waits for a lane they hold (docs/BENCHMARKS.md, "Test-suite cost, session
# 23"). WAIT_LANES=0: as before.
WAIT_LANES ?= 1
TEST_LANES := -n $(shell echo $$(( $(LANES) + $(WAIT_LANES) ))) --wait-lanes $(WAIT_LANES) \
	--dist loadfile --no-loadscope-reorder

# Nothing leaves the project's folders or the temp dir; no network beyond loopback.
export RAY_AUTH_MODE := disabled
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1
export DO_NOT_TRACK := 1
export HF_HOME := $(CURDIR)/.cache/hf
export VLLM_CACHE_ROOT := $(CURDIR)/.cache/vllm
export VLLM_SWEEP_CACHE_DIR := $(CURDIR)/.cache
export PIP_DISABLE_PIP_VERSION_CHECK := 1

GPU_VENV := .venv-gpu

.PHONY: install model sim-model samples browser postgres demo lint check test test-serial test-gpu clean

install: $(STAMP)

$(STAMP): pyproject.toml framework/tools/engine_setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[cpu,test]"
	$(BIN)/python -m framework.tools.engine_setup
	touch $@

model: $(MODEL)/config.json

$(MODEL)/config.json: $(STAMP) framework/tools/tiny_model.py
	$(BIN)/vllm-sweep build-model $(MODEL) --force

# sweeps/llama70b_sim.yaml's model folder: the 70B's architecture (config.json) and the tiny
# model's tokenizer, which the load generator and the simulated GPU engine count tokens with.
SIM_MODEL := models/llama70b-sim
sim-model: $(SIM_MODEL)/config.json

$(SIM_MODEL)/config.json: $(MODEL)/config.json model_configs/deepseek-r1-distill-llama-70b/config.json
	mkdir -p $(SIM_MODEL)
	cp $(MODEL)/tokenizer.json $(SIM_MODEL)/tokenizer.json
	cp model_configs/deepseek-r1-distill-llama-70b/config.json $@

# The timed-trace samples sweeps/trace_replay.yaml replays (datasets/mooncake_sample.jsonl,
# datasets/azure_sample.csv): made by project code, shipped, and checked equal to its output.
samples: $(STAMP)
	$(BIN)/python -m framework.tools.trace_samples datasets

# Headless Chromium for the HTML report's browser test (Debian's package; no browser download).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# Debian's PostgreSQL server programs for the study-storage tests (tests/storage_servers.py
# starts one in a temp folder, on a unix socket only); found on PATH or in /usr/lib/postgresql.
postgres:
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null)

# `run` exits 4 when no configuration meets the SLA (README, "Exit codes"): for the demo that is
# an answer, not a failure of the set-up.
demo: install model
	$(BIN)/vllm-sweep run $(SWEEP) || test $$? -eq 4

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

check: lint model sim-model postgres
	$(BIN)/python -m pytest -ra tests/unit $(IN_LANES)

test: lint model sim-model browser postgres
	$(BIN)/python -m pytest -ra --durations=25 $(TEST_LANES)

# One lane, in the same order: to read a failure's output in sequence.
test-serial: lint model sim-model browser postgres
	$(BIN)/python -m pytest -ra --durations=25

# Real-GPU tests for the first user with GPUs: the CUDA build of vLLM in its own venv, then
# tests/gpu (each skips itself without CUDA, two GPUs, or a second GPU node: RAY_ADDRESS).
test-gpu:
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q -e ".[gpu,test]"
	test -f $(MODEL)/config.json || $(GPU_VENV)/bin/vllm-sweep build-model $(MODEL)
	$(GPU_VENV)/bin/python -m pytest -ra -m gpu tests/gpu

# Set-up outputs only: results/ holds the user's measurements and is never removed here (#33).
clean:
	rm -rf $(VENV) $(GPU_VENV) models .cache
