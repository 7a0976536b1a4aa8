PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install bytecode test test-fast lint bench demo clean constraints llama

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip -c constraints.txt
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c constraints.txt
	$(MAKE) --no-print-directory bytecode
	touch $(STAMP)

# Refresh constraints.txt on purpose: the newest versions pyproject.toml's ranges admit,
# resolved in a scratch venv, then tested like any other change.
constraints:
	rm -rf .venv-constraints
	$(PYTHON) -m venv .venv-constraints
	.venv-constraints/bin/python -m pip install --quiet --upgrade pip
	.venv-constraints/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '1,2p' constraints.txt; .venv-constraints/bin/python -m pip freeze --all \
	  --exclude-editable | grep -v -e '^aiworker' -e '^setuptools=='; } > constraints.new
	mv constraints.new constraints.txt
	rm -rf .venv-constraints

# An editable install writes no bytecode when PYTHONDONTWRITEBYTECODE is set (as on
# these machines); a wheel install compiles it. Start-up benchmarks need it current.
bytecode:
	$(BIN)/python -m compileall -q aiworker > /dev/null

# Four workers on two cores: most tests wait on subprocesses, git and the sandbox forge.
# The page's browser test checks it with axe-core, from npm (pinned here).
AXE := .cache/npm/node_modules/axe-core/axe.min.js
$(AXE):
	npm install --silent --no-audit --no-fund --prefix .cache/npm axe-core@4.11.0

# The local model's tests run a real llama-server (built from PyPI into a cache outside
# the tree, reused) with a small GGUF model, and OpenCode from npm (pinned here).
OPENCODE := .cache/npm/node_modules/.bin/opencode
$(OPENCODE): $(AXE)  # one npm at a time in .cache/npm
	npm install --silent --no-audit --no-fund --prefix .cache/npm opencode-ai@1.18.33

llama: install $(OPENCODE)
	contrib/llama/build-llama $(BIN)/python

test: install $(AXE) llama
	$(BIN)/python -m pytest -q -n 4

test-fast: install
	$(BIN)/python -m pytest -q -n 4 -m 'not slow'

lint: install
	$(BIN)/ruff check aiworker tests benchmarks migrations
	$(BIN)/ruff format --check aiworker tests benchmarks migrations
	$(BIN)/mypy aiworker

# Each script prints its ratios and exits 1 when it misses its target; all run.
bench: install bytecode
	@missed=""; for script in benchmarks/*; do \
	  case "$$script" in *.md|*/__pycache__) continue;; esac; \
	  echo "== $$script"; $(BIN)/python "$$script" || missed="$$missed $$script"; done; \
	  if [ -n "$$missed" ]; then echo "missed targets:$$missed"; fi

demo: install
	$(BIN)/python -m aiworker.demo

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache
