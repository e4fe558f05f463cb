# The two commands of the README: `make run` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ADDR ?= 127.0.0.1:8000
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends

.PHONY: run test venv client services test-python smoke-sqlite compose-check worker clean

venv: $(STAMP)
$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

# The thin clients (client/: `carousel`, the XRootD hooks), installed as a package, not editable,
# so that their programs are on $(VENV)/bin as a user's pip would put them, even when .venv
# already had the server's requirements. Reinstalled when their sources change.
CLIENT_STAMP := $(VENV)/.client-installed
CLIENT_SOURCES := client/pyproject.toml $(wildcard client/carousel_client/*.py)
client: $(CLIENT_STAMP)
$(CLIENT_STAMP): $(STAMP) $(CLIENT_SOURCES)
	rm -rf client/build
	$(PY) -m pip install -q --force-reinstall --no-deps ./client
	$(PY) -m pip install -q ./client
	rm -rf client/build client/*.egg-info
	touch $(CLIENT_STAMP)

# The embedded default: SQLite under var/ (CAROUSEL_VAR_DIR: elsewhere; everything it writes goes
# there), Celery on its filesystem transport, beat inside the worker. With DATABASE_URL and
# REDIS_URL set, the same targets use PostgreSQL and Redis.
run: venv client
	@# WhiteNoise warns about a missing static root (the files themselves come from the apps).
	mkdir -p "$${CAROUSEL_STATIC_ROOT:-$${CAROUSEL_VAR_DIR:-var}/static}"
	$(PY) manage.py migrate --noinput
	@# Demo accounts only on the embedded default; DEMO=1 asks for them in another database.
	$(PY) manage.py demo $(if $(DEMO),--any-database)
	@echo "Carousel at http://$(ADDR)/  (admin: http://$(ADDR)/admin/, API: http://$(ADDR)/api/docs/)"
	@# Worker (with beat inside) and web server together; when either stops, both stop. Ctrl-C
	@# stops both and ends quietly: each server runs in a session of its own (setsid), so the
	@# terminal's SIGINT reaches only make and this shell, which sends each server one TERM, the
	@# signal it shuts down cleanly on (a worker hit by both could leave its beat running). The
	@# handler clears the traps first: a `kill 0` there signalled this shell too and ran the
	@# handler again, and again, until bash crashed ("Segmentation fault", exit 143). Once both have
	@# ended, what is left in their sessions is killed: a TERM that reaches the worker's beat child
	@# between its fork and its resetting of signals runs the worker's handler, inherited, which in
	@# a child only sets a flag beat never reads; that beat then ran on, orphaned (seen once in the
	@# suite, Ctrl-C a second after start). setsid from this shell, which has no job control, makes
	@# each server the leader of its session and group, so a job's pid is its group's id.
	@servers=""; stop() { trap - INT TERM HUP EXIT; kill $$(jobs -p) 2>/dev/null; wait; \
	  for pid in $$servers; do kill -KILL -- -$$pid 2>/dev/null; done; }; \
	trap 'stop; exit 0' INT TERM HUP; trap stop EXIT; \
	setsid $(PY) -m celery -A carousel worker -B --pool=solo -Q celery,control,delivery --loglevel=WARNING & \
	servers="$$!"; \
	setsid $(PY) manage.py runserver --noreload $(ADDR) & \
	servers="$$servers $$!"; \
	wait -n

# Debian packages the tests need, installed when missing (this machine's kind: Debian 12, root).
services:
	@missing=""; \
	[ -x /usr/lib/postgresql/15/bin/initdb ] || missing="$$missing postgresql-15"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v runuser >/dev/null || missing="$$missing util-linux"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v xrootd >/dev/null || missing="$$missing xrootd-server"; \
	command -v xrdfs >/dev/null || missing="$$missing xrootd-client"; \
	ls /usr/lib/*/libXrdOfsPrepGPI-5.so >/dev/null 2>&1 || missing="$$missing xrootd-server-plugins"; \
	for pkg in gfal2 gfal2-plugin-http gfal2-util-scripts python3-gfal2 wrk; do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	/usr/bin/python3 -c "import ensurepip" 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; apt-get update -q && $(APT_INSTALL) $$missing; \
	fi

test: venv client services
	@# The layers and the absence of cycles (.importlinter); tests/test_architecture.py checks them too.
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m carousel.infra.localservices -- $(MAKE) --no-print-directory test-python
	$(MAKE) --no-print-directory smoke-sqlite compose-check

# pytest once, in parallel (pytest-xdist): one process more than cores, since many tests spend
# their time waiting on the servers and workers they started (on 2 cores, 4 used 7 % more CPU
# than 3 and were no faster); a free worker takes tests from a busy one's queue (worksteal).
# tests/parallel.py keeps the workers apart.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test-python:
	@# Bytecode for the project's own modules, written once (0.5 s of CPU) before the suite: with
	@# PYTHONDONTWRITEBYTECODE set, as on this machine (CI runs on one like it), a fresh clone has
	@# none, and each of the hundred-odd Python processes the suite starts (Celery workers,
	@# gunicorns, manage.py runs) compiled the modules it imports again (`manage.py check`: 2.0 s
	@# of CPU, 1.6 s with them).
	$(PY) -m compileall -q -j 0 carousel api policies frontend tests manage.py
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The embedded default must not rot: migrate, submit, one loop cycle, on SQLite.
smoke-sqlite:
	@rm -rf var/smoke
	env -u DATABASE_URL -u REDIS_URL CAROUSEL_VAR_DIR=var/smoke $(PY) manage.py smoke

# Valid, and its default stager reads (simulated) tape: never `immediate` (tests/test_deploy.py checks more:
# among others, that it passes through every setting of the README's configuration table).
compose-check:
	env -u CAROUSEL_STAGER SECRET_KEY=compose-check docker-compose -f docker-compose.yml config > /dev/null
	@stagers=$$(env -u CAROUSEL_STAGER SECRET_KEY=compose-check docker-compose -f docker-compose.yml config \
	  | grep -E '^ +CAROUSEL_STAGER:'); echo "$$stagers" | sort -u; \
	  [ -n "$$stagers" ] && ! grep -q immediate <<< "$$stagers"
	@echo "docker-compose.yml is valid; its default stager is not immediate"

clean:
	rm -rf $(VENV) var

# Every benchmark (hours), then docs/benchmarks.md rewritten from their results (benchmarks/all.py).
# BENCH_ARGS="--only cycle ingest" runs some of them; BENCH_ARGS=--render only rewrites the table.
.PHONY: bench
bench: venv services
	$(PY) benchmarks/all.py $(BENCH_ARGS)
