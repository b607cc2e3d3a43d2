# Two commands do all set-up on a fresh machine:  make run  (the default benchmark)  and  make test.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# The CPU wheel on this machine. On a GPU machine keep your CUDA build: make TORCH="torch" ...
TORCH ?= torch==2.13.0

.PHONY: help install run test test-fast test-unit bench docs lint format train-toy clean

help:
	@echo "make run       - default benchmark: toy model, SJD vs AR (installs what it needs)"
	@echo "make test      - the test suite (installs what it needs)"
	@echo "make test-unit - the core, the adapter contracts and the decoder contract: the edit loop of minutes"
	@echo "make test-fast - the suite without the tests marked slow (audits, end-to-end runs)"
	@echo "make bench     - SJD vs AR on 32 toy prompts, window 16 (rows to outputs/runs.csv)"
	@echo "make docs      - the results pages docs/results/*.md from results/studies/*.csv"
	@echo "make train-toy - retrain the shipped toy checkpoint from its seed (~30 min, 2 cores)"
	@echo "make lint      - ruff"

# The installed torch is pinned as a constraint for the rest, so resolving the eval extra (torchvision
# pins its torch) can never swap it for another build: it fails loudly instead. The .pth file makes every
# python of this venv mend torchvision's import on the CPU torch at start-up (sjd/torchvision_compat.py),
# so transformers and torchmetrics import in any script, not only after `import sjd`.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -c "import torch; print('torch==' + torch.__version__)" 2>/dev/null > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q -e ".[dev,eval]" -c $(VENV)/torch-constraint.txt
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > $(VENV)/site-dir.txt
	echo "import sjd.torchvision_compat as c; c.install_torchvision_import_fix()" > "$$(cat $(VENV)/site-dir.txt)/sjd_torchvision_fix.pth"
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) run.py

# The suite runs in two pytest-xdist workers at one torch thread each (tests/conftest.py), sized for two cores;
# worksteal keeps each worker on a run of neighbouring tests. `make test TEST_WORKERS=0`: one process, two threads.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

test: install
	$(PYTEST)

test-fast: install
	$(PYTEST) -m "not slow"

# The unit tier: the pure functions, every adapter's contract and every decoder's contract (tests/<package>/).
UNIT := tests/core tests/models tests/decoders/test_decoder_contract.py tests/decoders/test_reference_sjd.py
test-unit: install
	$(PYTEST) -m "not slow" $(UNIT)

bench: install
	$(PY) run.py prompts.n=32 decoder.window=16 experiment_name=bench_toy_sjd

docs: install
	$(PY) scripts/results_pages.py

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

train-toy: install
	$(PY) scripts/train_toy.py

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
