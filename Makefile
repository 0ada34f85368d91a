# Two commands for a newcomer: `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint format migrate chaos chaos-hosts bench clean chromium

$(STAMP): requirements.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	@touch $(STAMP)

# Development commands run with DEBUG on (development keys); production sets DEBUG=False
# with SECRET_KEY and FIELD_ENCRYPTION_KEY (README, Production). `make test` sets its own.
run migrate lint chaos chaos-hosts bench: export DEBUG ?= True

migrate: $(STAMP)
	$(BIN)/python manage.py migrate --noinput

# Migrate, create the demo account (printed once), run the recovery scan, then start
# daphne, qcluster and the queue service together. Ctrl-C stops all three.
run: migrate
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py recover_queue
	$(BIN)/python manage.py run_stack

# The whole suite, browser tests included. DATABASE_URL / REDIS_URL select PostgreSQL and
# Redis. REQUIRE_BROWSER=1 makes a missing Chromium a failure, never a silent skip.
test: $(STAMP) chromium
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
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not processes and not browser" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

N ?= 200
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos --jobs $(N)

# Several hosts and host-level faults (root: network namespaces, nftables, private
# PostgreSQL and Redis servers): bench/chaos_hosts.py, then bench/chaos_faults.py when
# present. HOSTS_ARGS passes options to the first, e.g. HOSTS_ARGS="--ci --seed 7 --runs 3",
# FAULTS_ARGS to the second.
HOSTS_ARGS ?=
FAULTS_ARGS ?=
chaos-hosts: $(STAMP)
	$(BIN)/python -m bench.chaos_hosts $(HOSTS_ARGS)
	if [ -f bench/chaos_faults.py ]; then $(BIN)/python -m bench.chaos_faults $(FAULTS_ARGS); fi

# Every benchmark (bench/run_all.py); writes bench/RESULTS.md, the latest run only.
# BENCH_DB_PREFIX=you_ names its databases apart from anyone else's on the same server.
bench: $(STAMP)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf var/ .pytest_cache
