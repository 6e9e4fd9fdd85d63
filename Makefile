# Everything starts from a fresh clone: the first target that needs the virtualenv creates it.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing hookbus with its dev tools"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hookbus demo

lint: $(STAMP)
	$(BIN)/ruff check bus workers agent_adapter tests bench
	$(BIN)/ruff format --check bus workers agent_adapter tests bench
	$(BIN)/mypy bus

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
