# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# A portable llama.cpp build: -march=native picks AMX/AVX-512 kernels that
# crash on some machines, and a wheel built for one CPU is cached for others.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON

.PHONY: run test lint install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[all,example]' --group dev  # every opt-in part, as the example project enables them
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py chatparity_bootstrap
	@echo "Demo API key (shown once): $$($(BIN)/python manage.py createapikey demo)"
	@echo "OpenAI base_url: http://$(HOST):$(PORT)/v1  model: smollm2"
	$(BIN)/uvicorn project.asgi:application --host $(HOST) --port $(PORT) --lifespan off

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy chatparity project
	$(BIN)/lint-imports
