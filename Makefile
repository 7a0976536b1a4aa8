PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install bytecode test test-fast lint bench demo clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(MAKE) --no-print-directory bytecode
	touch $(STAMP)

# An editable install writes no bytecode when PYTHONDONTWRITEBYTECODE is set (as on
# these machines); a wheel install compiles it. Start-up benchmarks need it current.
bytecode:
	$(BIN)/python -m compileall -q aiworker > /dev/null

# Four workers on two cores: most tests wait on subprocesses, git and the sandbox forge.
test: install
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
