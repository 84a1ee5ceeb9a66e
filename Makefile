# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# A portable llama.cpp build: -march=native picks AMX/AVX-512 kernels that
# crash on some machines, and a wheel built for one CPU is cached for others.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
# The llama-cpp-python requirement the [local] extra pins, installed on its own first.
LLAMA_CPP := $(shell grep -o -m 1 'llama-cpp-python==[0-9.]*' pyproject.toml)

.PHONY: run test lint install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# What `make run` serves with: the example project's extra (pyproject.toml), no more.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	@echo "==> $(LLAMA_CPP): unless pip built its wheel before (it keeps it), pip now compiles"
	@echo "    llama.cpp (C++) for the local model: several minutes (about 6 on 2 cores)."
	$(BIN)/pip install '$(LLAMA_CPP)'
	@echo "==> chatparity with the extras the example project enables: .[example]"
	$(BIN)/pip install -e '.[example]'
	touch $@

# What `make test` and `make lint` need besides: every extra and the dev group.
$(VENV)/.installed: $(VENV)/.installed-run
	@echo "==> every extra and the tests' and tools' packages: .[all,example] --group dev"
	$(BIN)/pip install -e '.[all,example]' --group dev
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed-run
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py chatparity_bootstrap
	$(BIN)/python manage.py demo --host $(HOST) --port $(PORT)
	$(BIN)/uvicorn project.asgi:application --host $(HOST) --port $(PORT) --lifespan off

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy chatparity project
	$(BIN)/lint-imports
