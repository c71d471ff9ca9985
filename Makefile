# Set-up and entry points. `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kpo-installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test demo bench lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first (a pinned CPU wheel; an unpinned torch would pull a multi-GB CUDA build), then the project.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# verl's own environment: a second venv where pip resolves verl 0.9.1's requirements together with all of kpo's
# extras (transformers inside verl's range), on the same CPU torch (~70 s; see the script header).
VERL_VENV ?= .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.kpo-installed
$(VERL_PY):
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install --quiet --upgrade pip

$(VERL_STAMP): $(VERL_PY) pyproject.toml scripts/install_verl_cpu.sh
	$(VERL_PY) -m pip install --quiet "$(TORCH_SPEC)"
	scripts/install_verl_cpu.sh $(VERL_VENV)
	touch $(VERL_STAMP)

install: $(STAMP) $(VERL_STAMP)

# The suite in .venv (newest transformers; the tests that need verl skip there) and, at the same time, in verl's
# environment what only it can test: the plugin and verl's main_ppo (alone, and as `kpo compare --engine verl` on a
# local Ray cluster: tests/integrations/test_verl_compare.py, about 8 of its 13 minutes on CI), the losses' parity
# with verl's, `import kpo`, and the parts of `kpo train` that touch transformers and TRL (runs, resume, TRL's
# generate path) on the older transformers verl pins. The rest is not run twice: both environments have the same
# torch, numba, numpy and triton, and kpo's own logic (interrupts, processes, faults, sampler) does not depend on
# transformers' release. VERL_ONLY: tests that run in verl's environment only, to balance the halves (kpo train's
# multi-process tests, torch.distributed on gloo: about 2 of the .venv half's 16 minutes on CI).
VERL_ONLY := tests/train/test_train_multiprocess.py
VERL_TESTS := tests/losses/test_verl_*.py tests/integrations tests/test_public_api.py \
	tests/train/test_train_run.py tests/train/test_rollout.py $(VERL_ONLY)
# The two run side by side (each keeps about one of 2 cores busy: subprocesses, compiles, Ray's waits); verl's
# output goes to VERL_LOG and is printed once the suite has finished, so the two reports do not interleave.
VERL_LOG ?= .pytest-verl.log
# The two environments install side by side too (each pip keeps about one core busy): the verl half, the longer,
# starts about as soon as its own environment is ready. --durations: where the time went, in CI's log.
VERL_PYTEST := $(VERL_PY) -m pytest -q -p no:asyncio -p no:cacheprovider --durations=15 $(VERL_TESTS)
test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(VERL_STAMP)
	@$(VERL_PYTEST) > $(VERL_LOG) 2>&1 & verl=$$!; \
	trap 'kill $$verl 2>/dev/null' INT TERM; \
	$(PY) -m pytest -q --durations=15 tests $(addprefix --ignore=,$(VERL_ONLY)); suite=$$?; \
	wait $$verl; verl_status=$$?; \
	echo; echo "== .venv-verl: $(VERL_PYTEST)"; cat $(VERL_LOG); \
	test $$suite -eq 0 && test $$verl_status -eq 0

# The main job: KPO on the embedded long-response task (128-token responses; the warm start is built and cached
# on first use), then the warm start and the trained model evaluated on the same 256 held-out problems, and
# summary.json with 95% intervals. About 3 minutes on 2 idle CPU cores (the warm start built in it). DEMO_ARGS
# replaces the `kpo train` loss flags, e.g.
# make demo DEMO_ARGS="--loss vanilla".
DEMO_DIR ?= runs/demo
DEMO_ARGS ?= --loss kpo --loss-kwargs memory=matched
DEMO_EVAL := --data synthetic --n 4 --k 1,4 --batch-size 128
demo: $(STAMP)
	$(VENV)/bin/kpo train --output-dir $(DEMO_DIR) --overwrite --max-steps 60 \
		--dump-ratios-every 10 --num-threads 2 --report-to none $(DEMO_ARGS)
	$(VENV)/bin/kpo eval --model $(DEMO_DIR)/warm_start $(DEMO_EVAL) --output $(DEMO_DIR)/eval_warm_start.json
	$(VENV)/bin/kpo eval --model $(DEMO_DIR)/final $(DEMO_EVAL) --output $(DEMO_DIR)/eval.json
	$(VENV)/bin/kpo summary $(DEMO_DIR)
	@echo
	@echo "summary:          $(DEMO_DIR)/summary.json"
	@echo "training metrics: $(DEMO_DIR)/metrics.jsonl"
	@echo "training plot:    $(DEMO_DIR)/training_dynamics.png"
	@echo "eval reports:     $(DEMO_DIR)/eval_warm_start.md, $(DEMO_DIR)/eval.md"
	@echo "ratio dumps:      $(DEMO_DIR)/ratios/ (kpo analyze $(DEMO_DIR))"

bench: $(STAMP)
	$(VENV)/bin/kpo bench filter

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) $(VERL_VENV) .pytest_cache .ruff_cache $(VERL_LOG)
