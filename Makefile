# The README's two commands: `make book` and `make test`. Everything else is a helper of those.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
# Extras installed into .venv (see pyproject.toml); exact versions come from constraints.txt.
EXTRAS ?= repro,book,test,mcmc,data,sklearn,flax,equinox,gp
PROFILE ?= quick
export BOOTENS_PROFILE ?= $(PROFILE)
# Results computed while building/testing stay inside the checkout (never a stale global cache).
export BOOTENS_CACHE_DIR ?= $(CURDIR)/.bootens_cache
export BOOTENS_DATA_DIR ?= $(abspath $(CURDIR)/../shared/data/uci)
# Bytecode is written when a module is first imported, also where the environment sets
# PYTHONDONTWRITEBYTECODE=1 (this machine does; without bytecode every process compiles what it imports:
# `import jax, tensorflow, gpflow` ~15 s instead of ~5 s). Compiling all of .venv at install time instead
# (UV_COMPILE_BYTECODE=1) took 27 s of the 31-s install, most of it for modules nothing imports; the first
# import of what the book and the tests use compiles it in 11 s.
unexport PYTHONDONTWRITEBYTECODE
JOBS ?= 2
comma := ,
# Each stage of `make test` prints "timing: <stage> <seconds> s" when it succeeds (.ci/run collects them).
TIMED = s=$$(date +%s); $(1) && echo "timing: $@ $$(( $$(date +%s) - s )) s"

.PHONY: help venv book test test-unit test-nbval test-browser browser-deps clean lock isa-check \
  test-unit-when-a-core-is-free test-after-book

help:
	@echo "make book   - create .venv, install, build the whole book ($(BOOTENS_PROFILE) profile) into _build/html"
	@echo "make test   - the whole suite: unit + statistical tests, nbval over book/*.ipynb, book build, rendered book in Chromium"
	@echo "make lock   - regenerate constraints.txt from pyproject.toml"
	@echo "make isa-check ISA=AVX - execute every chapter under XLA's AVX instruction set, compare with the committed outputs"
	@echo "make clean  - remove _build and the result cache"

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

# Reinstall whenever the pins or the package metadata change.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/uv
	$(BIN)/uv pip install --python $(BIN)/python -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

venv:
	@$(call TIMED,$(MAKE) --no-print-directory $(VENV)/.installed)

# MPLBACKEND is unset for the build: exported as Agg it reaches the notebook kernels, which then draw no
# inline figures (plt.show() outputs nothing) and the chapters lose their images.
# The chapters are executed JOBS at a time first, each on a core of its own (.ci/execute_book.py), then
# rendered from Jupyter Book's execution cache.
# BOOK_SIGNALS (set by `make test`): the files .ci/execute_book.py creates as soon as a core has no chapter
# left to execute, and keeps while chapters but the performance chapter may be executing.
book: venv
	@$(call TIMED,env -u MPLBACKEND $(BIN)/python .ci/execute_book.py --jobs $(JOBS) $(BOOK_SIGNALS) && \
	  env -u MPLBACKEND $(BIN)/jupyter-book build . -W -n --keep-going --builder html) \
	  $(if $(BOOK_SIGNALS),|| { touch $(CORE_FREE); rm -f $(BOOK_RUNNING); exit 1; })

# The chapters first; as soon as a core has no chapter left, the unit tests start at the lowest priority
# (nice 19): beside the last chapter and the performance chapter, which times code and runs after the
# others, they take only the processor time these leave idle. Once the book is built, nbval and the browser
# test, which read the built book and nothing else, run beside them. Each target's output is printed whole
# when it ends. The unit tests read the chapter runs they check from the book's result cache instead of
# computing them again (BOOTENS_BOOK_CACHE, see tests/conftest.py), waiting for them while the book's
# chapters execute (BOOTENS_BOOK_RUNNING).
CORE_FREE := _build/.core-free
BOOK_RUNNING := _build/.chapters-running
test: venv
	@rm -f $(CORE_FREE) $(BOOK_RUNNING)
	@$(MAKE) --no-print-directory -j4 --output-sync=target \
	  BOOK_SIGNALS="--core-free $(CORE_FREE) --running $(BOOK_RUNNING)" book test-unit-when-a-core-is-free \
	  test-after-book

test-unit-when-a-core-is-free: venv
	@while [ ! -e $(CORE_FREE) ]; do sleep 2; done
	@$(MAKE) --no-print-directory test-unit NICE="nice -n 19" BOOTENS_BOOK_RUNNING=$(CURDIR)/$(BOOK_RUNNING)

test-after-book: book
	@$(MAKE) --no-print-directory test-nbval test-browser

# The log lists the 40 slowest tests (--durations): where the unit stage's time goes. Tests that check a
# chapter's own run share it with the book build: read when the book computed it, else computed and handed
# over (BOOTENS_BOOK_CACHE, see tests/conftest.py).
test-unit: venv
	@$(call TIMED,BOOTENS_BOOK_CACHE=$(BOOTENS_CACHE_DIR) $(NICE) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile \
	  -m "not browser" --durations=40 tests)

test-nbval: venv
	@$(call TIMED,$(BIN)/python -m pytest -n $(JOBS) --dist loadfile --nbval-lax -p no:cacheprovider book)

# The browser test needs Debian's chromium; as root we install it, otherwise say what to do.
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; \
	  else echo "The browser test needs Debian's chromium: sudo apt-get install chromium"; exit 1; fi; \
	fi

test-browser: venv browser-deps
	@$(call TIMED,$(BIN)/python -m pytest -m browser tests)

# What another CPU would print: every chapter executed with XLA capped to $(ISA), compared output by output
# with the committed notebooks (report in _build/isa-$(ISA)/report.md; fails if a checked output differs).
ISA ?= AVX
isa-check: venv
	@$(call TIMED,$(BIN)/python .ci/isa_check.py --isa $(ISA) --out _build/isa-$(ISA))

lock:
	uv pip compile pyproject.toml $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e)) --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 -o constraints.txt --no-header --no-annotate

clean:
	rm -rf _build .bootens_cache
