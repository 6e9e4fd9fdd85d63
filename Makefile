# Everything starts from a fresh clone: the first target that needs the virtualenv creates it.
# Every package comes from a lock file with hashes (requirements/*.txt, made by `make lock`):
# an unpinned install took whatever was released that day, and a new release broke `make test`
# on a fresh clone. `make demo` installs only the runtime (requirements/runtime.txt);
# `make test` adds the development tools (requirements/dev.txt, a superset pinned alike).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
sum     = $(shell cat pyproject.toml $(1) | cksum | cut -d' ' -f1)
RUNTIME = $(VENV)/.runtime-$(call sum,requirements/runtime.txt)
DEV     = $(VENV)/.dev-$(call sum,requirements/dev.txt)
PIP     = $(BIN)/python -m pip install --quiet --no-deps --require-hashes

.PHONY: demo test lint bench clean redis-check lock

$(RUNTIME): pyproject.toml requirements/runtime.txt
	@echo "==> creating $(VENV) and installing hookbus's runtime from requirements/runtime.txt"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements/runtime.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@rm -f $(VENV)/.runtime-*
	@touch $@

$(DEV): $(RUNTIME) requirements/dev.txt
	@echo "==> installing the development tools from requirements/dev.txt"
	$(PIP) -r requirements/dev.txt
	@rm -f $(VENV)/.dev-*
	@touch $@

# Regenerate both lock files from pyproject.toml with uv (pinned here, in a virtualenv of its own).
lock:
	@test -x .lock-tools/bin/uv || { $(PYTHON) -m venv .lock-tools && .lock-tools/bin/pip install --quiet 'uv==0.13.9'; }
	.lock-tools/bin/uv pip compile pyproject.toml --extra dev --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header -o requirements/dev.txt
	.lock-tools/bin/uv pip compile pyproject.toml --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header \
	  -c requirements/dev.txt -o requirements/runtime.txt

demo: $(RUNTIME)
	$(BIN)/hookbus demo

lint: $(DEV)
	$(BIN)/ruff check bus workers agent_adapter tests bench
	$(BIN)/ruff format --check bus workers agent_adapter tests bench
	$(BIN)/mypy bus

test: lint redis-check node-deps
	$(BIN)/pytest

# deploy/redis/users.acl: the ACL users of the Compose stack's hooks and the demo tenant
# (workers/ops/acl.py; tests/test_deploy.py checks it is up to date).
STACK_HOOKS = workers.builtins.cancellation:RedisCancellationHook,workers.builtins.demo_hooks:SecretGuard,workers.builtins.policy:Policy,workers.builtins.audit:AsyncAuditLogHook,workers.builtins.metrics:AsyncMetricsHook
.PHONY: acl
acl: $(DEV)
	$(BIN)/hookbus acl --hooks $(STACK_HOOKS) --tenants demo -o deploy/redis/users.acl

# Tests that claim Redis behaviour need a real server: say so plainly instead of a traceback.
redis-check:
	@command -v redis-server >/dev/null 2>&1 || [ -n "$$REDIS_URL" ] || docker info >/dev/null 2>&1 || \
	  { echo "make test needs a redis-server binary on PATH (Debian: apt install redis-server), REDIS_URL, or a Docker engine"; exit 1; }

# The Node.js example client's npm packages (tests/test_foreign_clients.py runs the client), and
# Claude Code's hook types with the schema generator (tests/test_claude_code_schemas.py):
# installed when node_modules is missing or package-lock.json is newer. Claude Code's own binary
# is an optional dependency of the SDK and is left out (--omit=optional): only its types are used.
# The real Claude Code CLI (tests/test_claude_code_cli.py runs it offline) has a package of its
# own, tests/claude_cli: its binary is an optional dependency per platform, so it is installed
# with optional dependencies.
.PHONY: node-deps
node-deps: examples/node/node_modules/.package-lock.json examples/claude-code/node_modules/.package-lock.json tests/claude_cli/node_modules/.package-lock.json tests/mcp_server/node_modules/.package-lock.json

examples/node/node_modules/.package-lock.json: examples/node/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make test needs Node.js >= 20.15 and npm (for examples/node)"; exit 1; }
	npm ci --prefix examples/node --no-audit --no-fund
	@touch $@

examples/claude-code/node_modules/.package-lock.json: examples/claude-code/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make test needs Node.js >= 20 and npm (for examples/claude-code)"; exit 1; }
	npm ci --prefix examples/claude-code --omit=optional --no-audit --no-fund
	@touch $@

tests/claude_cli/node_modules/.package-lock.json: tests/claude_cli/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make test needs Node.js >= 20 and npm (for tests/claude_cli: Claude Code's CLI)"; exit 1; }
	npm ci --prefix tests/claude_cli --no-audit --no-fund
	@test -x tests/claude_cli/node_modules/.bin/claude && tests/claude_cli/node_modules/.bin/claude --version >/dev/null || \
	  { echo "tests/claude_cli: Claude Code's CLI did not install its native binary for this platform"; exit 1; }
	@touch $@

# The reference MCP filesystem server that tests/test_mcp_proxy.py puts behind `hookbus mcp`.
tests/mcp_server/node_modules/.package-lock.json: tests/mcp_server/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make test needs Node.js >= 20 and npm (for tests/mcp_server: the MCP filesystem server)"; exit 1; }
	npm ci --prefix tests/mcp_server --no-audit --no-fund
	@touch $@

bench: $(DEV) tests/mcp_server/node_modules/.package-lock.json
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .lock-tools .pytest_cache .mypy_cache .ruff_cache .hypothesis
