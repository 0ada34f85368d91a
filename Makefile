# Two commands for a newcomer: `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test test-fast lint format migrate chaos chaos-hosts bench clean chromium lock

# The runtime packages only (make run); the test and tooling ones (requirements-dev.txt)
# when a target needs them. scripts/install.py installs the pinned set (requirements.lock)
# with several pip processes at once, then checks it against requirements.txt.
$(STAMP): requirements.txt requirements.lock
	$(PY) scripts/install.py || python3 scripts/install.py
	@touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PY) scripts/install.py --dev || python3 scripts/install.py --dev
	@touch $(DEV_STAMP)

# Pin the runtime set again after requirements.txt changes (a stale lock is only slower).
lock:
	rm -rf var/lock-venv && $(PY) -m venv var/lock-venv
	var/lock-venv/bin/pip install -q --disable-pip-version-check --prefer-binary -r requirements.txt
	{ echo "# The runtime set of requirements.txt, pinned by 'make lock' for scripts/install.py."; \
	  echo "# pins requirements.txt sha256 $$(sha256sum requirements.txt | cut -d' ' -f1)"; \
	  var/lock-venv/bin/pip freeze; } > requirements.lock
	rm -rf var/lock-venv

# Development commands run with DEBUG on (development keys); production sets DEBUG=False
# with SECRET_KEY and FIELD_ENCRYPTION_KEY (README, Production). `make test` sets its own.
run migrate lint chaos chaos-hosts bench: export DEBUG ?= True

migrate: $(STAMP)
	$(BIN)/python manage.py migrate --noinput

# Migrate, start the web server, create the demo account (printed once), run the recovery
# scan, then start qcluster and the queue service: one Python start-up for the preparation
# (run_stack --prepare), the web process first. Ctrl-C stops all three.
run: $(STAMP)
	$(BIN)/python manage.py run_stack --prepare

# The whole suite, browser tests included. DATABASE_URL / REDIS_URL select PostgreSQL and
# Redis. REQUIRE_BROWSER=1 makes a missing Chromium a failure, never a silent skip.
test: $(DEV_STAMP) chromium
	REQUIRE_BROWSER=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

# The browser tests drive Debian's Chromium: installed here when missing (as root, with
# apt-get), otherwise the target stops and says how.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "== installing Debian's chromium for the browser tests (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "make test runs the browser tests with Debian's Chromium at $(CHROMIUM), which is not installed."; \
	    echo "Install it with:  sudo apt-get install chromium"; \
	    echo "or run 'make test-fast', which leaves the browser and process tests out."; \
	    exit 1; \
	  fi; }
	@test -x $(CHROMIUM) || { echo "apt-get ran but $(CHROMIUM) is still missing: install Debian's chromium package"; exit 1; }

# Without the tests that start processes or a browser.
test-fast: $(DEV_STAMP)
	$(BIN)/python -m pytest -m "not processes and not browser" $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run

format: $(DEV_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

N ?= 200
chaos: $(DEV_STAMP)
	$(BIN)/python -m bench.chaos --jobs $(N)

# Several hosts and host-level faults (root: network namespaces, nftables, private
# PostgreSQL and Redis servers): bench/chaos_hosts.py, then bench/chaos_faults.py when
# present. HOSTS_ARGS passes options to the first, e.g. HOSTS_ARGS="--ci --seed 7 --runs 3",
# FAULTS_ARGS to the second.
HOSTS_ARGS ?=
FAULTS_ARGS ?=
chaos-hosts: $(DEV_STAMP)
	$(BIN)/python -m bench.chaos_hosts $(HOSTS_ARGS)
	if [ -f bench/chaos_faults.py ]; then $(BIN)/python -m bench.chaos_faults $(FAULTS_ARGS); fi

# Every benchmark (bench/run_all.py); writes bench/RESULTS.md, the latest run only.
# BENCH_DB_PREFIX=you_ names its databases apart from anyone else's on the same server.
bench: $(DEV_STAMP)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf var/ .pytest_cache
