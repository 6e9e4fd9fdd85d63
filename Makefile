# Everything starts from a fresh clone: the first target that needs the virtualenv creates it.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint bench clean redis-check

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

test: lint redis-check node-deps
	$(BIN)/pytest

# deploy/redis/users.acl: the ACL users of the Compose stack's hooks and the demo tenant
# (workers/acl.py; tests/test_deploy.py checks it is up to date).
STACK_HOOKS = workers.cancellation:RedisCancellationHook,workers.demo_hooks:SecretGuard,workers.audit:AsyncAuditLogHook,workers.metrics:AsyncMetricsHook
.PHONY: acl
acl: $(STAMP)
	$(BIN)/hookbus acl --hooks $(STACK_HOOKS) --tenants demo -o deploy/redis/users.acl

# Tests that claim Redis behaviour need a real server: say so plainly instead of a traceback.
redis-check:
	@command -v redis-server >/dev/null 2>&1 || [ -n "$$REDIS_URL" ] || docker info >/dev/null 2>&1 || \
	  { echo "make test needs a redis-server binary on PATH (Debian: apt install redis-server), REDIS_URL, or a Docker engine"; exit 1; }

# The Node.js example client's npm packages (tests/test_foreign_clients.py runs the client), and
# Claude Code's hook types with the schema generator (tests/test_claude_code_schemas.py):
# installed when node_modules is missing or package-lock.json is newer. Claude Code's own binary
# is an optional dependency of the SDK and is left out (--omit=optional): only its types are used.
.PHONY: node-deps
node-deps: examples/node/node_modules/.package-lock.json examples/claude-code/node_modules/.package-lock.json

examples/node/node_modules/.package-lock.json: examples/node/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make test needs Node.js >= 20.15 and npm (for examples/node)"; exit 1; }
	npm ci --prefix examples/node --no-audit --no-fund
	@touch $@

examples/claude-code/node_modules/.package-lock.json: examples/claude-code/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make test needs Node.js >= 20 and npm (for examples/claude-code)"; exit 1; }
	npm ci --prefix examples/claude-code --omit=optional --no-audit --no-fund
	@touch $@

bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
