# Two commands do all set-up on a fresh machine (Python 3.11 + gcc): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-installed

.PHONY: build demo test test-arm64 lint dist bench soak-memory bench-readme clean chromium redis postgres shellcheck

# The runtime dependencies are pyproject.toml's `[project] dependencies` (the one list), written
# out as a requirements file; then the build tools and the test-only SDKs.
$(STAMP): pyproject.toml packaging/runtime_deps.py requirements-build.txt requirements-sdk.txt requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python packaging/runtime_deps.py > $(VENV)/requirements-runtime.txt
	$(BIN)/pip install -q --disable-pip-version-check -r $(VENV)/requirements-runtime.txt \
	  -r requirements-dev.txt
	touch $@

BUILT := $(VENV)/.built
# cbusbar's sources, and busbar's compiled modules: each .py with an augmenting .pxd beside it.
CYTHON_SOURCES := $(shell find cbusbar -name '*.pyx' -o -name '*.pxd') \
	$(foreach p,$(shell find busbar -name '*.pxd'),$(p) $(p:.pxd=.py))

# Compiles every cbusbar extension in place (editable install; no pure-Python fallback), profile-
# guided: instrumented, trained on every protocol pair, compiled again (packaging/build_ext.sh, ~1.5
# min more than one compile). `make build PGO=0`: one plain compile. Redone only when a Cython source
# or the build files change.
PGO ?= 1
build: $(BUILT)

$(BUILT): $(STAMP) $(CYTHON_SOURCES) setup.py pyproject.toml packaging/build_ext.sh packaging/pgo_train.py
	PY=$(BIN)/python PGO=$(PGO) packaging/build_ext.sh
	touch $@

demo: build
	$(BIN)/busbar serve --demo

test: lint build chromium redis postgres
	$(BIN)/python -m pytest

# ruff over the Python tree and cython-lint over the Cython sources (cbusbar's .pyx and .pxd,
# busbar's augmenting .pxd), each with its settings in pyproject.toml, and actionlint over the
# GitHub Actions workflows (the release matrix runs only on a tag: a mistake in it would show
# on release day otherwise); all run, and any failing fails the target; `make test` runs it first
# (#35). cython-lint runs pycodestyle, which it finds on PATH: hence the venv's bin first.
CYTHON_LINTED := $(sort $(shell find cbusbar -name '*.pyx' -o -name '*.pxd') $(shell find busbar -name '*.pxd'))
lint: $(STAMP) shellcheck
	@rc=0; \
	$(BIN)/ruff check . || rc=1; \
	PATH=$(BIN):$$PATH $(BIN)/cython-lint $(CYTHON_LINTED) || rc=1; \
	$(BIN)/actionlint .github/workflows/*.yml || rc=1; \
	exit $$rc

# Headless Chromium for the status-page test (Debian's package, without its recommended packages:
# the test needs the browser only, not ~130 desktop packages). Installed when missing, as root or
# through passwordless sudo; when neither works the test skips and says why.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; } \
	  || echo "chromium could not be installed; the status-page test will skip"; }

# shellcheck for actionlint, which checks the workflows' `run:` scripts with it when it is on PATH
# (Debian's package; installed when missing, as root or through passwordless sudo).
shellcheck:
	@command -v shellcheck >/dev/null 2>&1 || { \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends shellcheck; } \
	  || echo "shellcheck could not be installed; actionlint checks the workflows without it"; }

# redis-server for the Redis store's tests (Debian's package; tests/redis_server.py starts one per
# test session on a free loopback port and stops it). Installed when missing, as root or through
# passwordless sudo; when neither works those tests skip and say why.
redis:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || { \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends redis-server; } \
	  || echo "redis-server could not be installed; the Redis store tests will skip"; }

# PostgreSQL for the Postgres store's tests (Debian's package; tests/postgres_server.py initdb's a
# throwaway cluster per test session in a temporary directory, on a free loopback port, as `nobody`
# when run as root since PostgreSQL refuses root, and stops it). Installed when missing, as root or
# through passwordless sudo; when neither works those tests skip and say why.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends postgresql; } \
	  || echo "postgresql could not be installed; the Postgres store tests will skip"; }

# One static executable (dist/busbar) and its container image (dist/busbar-image.tar, dist/oci/).
# `make dist ARCH=arm64` on an x86_64 machine also builds dist/arm64/busbar under emulation
# (packaging/build_foreign.sh: a Debian arm64 root filesystem kept in $(ROOTFS), qemu-user-static,
# binfmt_misc, cbusbar cross-compiled by Debian's gcc-aarch64-linux-gnu; as root; the first run ~40 min on two busy cores, later ones ~10) and makes dist/oci/ one image
# index of both architectures.
ARCH ?=
ROOTFS ?= $(HOME)/.cache/busbar/rootfs-$(ARCH)
dist: build
	packaging/build.sh
ifneq ($(ARCH),)
	BUSBAR_ROOTFS=$(ROOTFS) packaging/build_foreign.sh $(ARCH)
	$(BIN)/python packaging/oci_image.py --executable dist/busbar --executable dist/$(ARCH)/busbar
endif

# The arm64 executable under emulation: the SDK suites through it, gateway and mock both
# (tests/packaging/test_foreign.py, marked slow: `make test` leaves it out; the suites take ~20 s
# emulated, the build before them ~10 min once the root filesystem exists).
test-arm64:
	$(MAKE) dist ARCH=arm64
	$(BIN)/python -m pytest -m slow tests/packaging/test_foreign.py

# The benchmark table (bench/README.md): busbar vs the floor proxy vs LiteLLM, same mock, same run.
bench: build
	$(BIN)/python bench/run.py

# The hostile memory soak (bench/README.md): unique ~150 KB bodies, 1000 connections, 60 s,
# Anthropic in -> OpenAI lane, busbar with its default workers; exits 1 when it fails its bounds.
soak-memory: build
	$(BIN)/python bench/soak_memory.py

# README.md's performance block from bench/published/ (python bench/readme.py --check to compare).
bench-readme:
	$(BIN)/python bench/readme.py

clean:
	rm -rf build dist *.egg-info $(VENV)
	find cbusbar -name '*.so' -delete -o -name '*.c' -delete
