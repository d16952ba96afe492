# TACC stack: the two commands a newcomer runs are `make demo` and `make test`.
# Both install what they need on a fresh Debian 13 or 12 machine (run as root).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
LAB_NODES ?= 3
# The lab make demo / lab-up / lab-down work on (several side by side: LAB_NAME=demo) and
# the inventory `tacc-lab up` writes for it (ansible.cfg names the default lab's).
LAB_NAME ?= $(or $(TACC_LAB_NAME),lab)
LAB_INVENTORY := inventory/$(LAB_NAME)/hosts.yml

# Host packages: the lab (nspawn, debootstrap, proxy), ssh, a venv-capable Python, and
# rsync (the baseline bench/tcloud_upload.py measures tcloud against).
# Without Recommends: python3-pip's would add a compiler and headers (153 packages,
# 118 MiB; 32 and 13 MiB without, measured in a bookworm minbase chroot: 103 s vs 27 s),
# and every wheel the venv needs is binary. debootstrap still checks the archive's
# signatures: gpgv and debian-archive-keyring come with apt itself.
# mmdebstrap builds the demo's prebaked node image (packages/ops/tacc_lab/prebake.py);
# with umoci and skopeo also the lab's container image (`tacc-lab up --container-image`).
# procps: the tests look for leftover processes with pgrep (a minimal Debian 13 lacks it).
APT_PACKAGES := systemd-container debootstrap mmdebstrap tinyproxy iproute2 openssh-client \
	python3-venv python3-pip ca-certificates rsync umoci skopeo prometheus prometheus-alertmanager \
	procps
# The dashboard's browser tests (tests/integration/browser.py) drive Debian's Chromium
# headless through its chromedriver (Selenium, the dev extra): both from the host's own
# release, never a download. Only the dev venv (make test, check, unit, playbook,
# integration) asks for them, so `make demo` does not pull a browser.
BROWSER_PACKAGES := chromium chromium-driver
STAMP := .cache/stamps

.PHONY: help deps venv demo test check lint unit playbook integration molecule upgrade-test lab-up lab-down clean gpu-check gpu-check-bundle

help:
	@echo "make demo      set up everything, boot the lab, provision it, show it working"
	@echo "make test      the full suite: lint, unit, playbook, lab integration, molecule default"
	@echo "make check     the inner loop, a few minutes: lint + unit (no ansible-playbook, no lab)"
	@echo "make lint      ruff + ansible-lint (production profile)"
	@echo "make upgrade-test  a 3-node site moved from Debian 12 to 13 (not in make test)"
	@echo "make lab-up    boot the virtual cluster (LAB_NODES=$(LAB_NODES))"
	@echo "make lab-down  remove the virtual cluster, leaving nothing behind"
	@echo "make bench     run every bench script on a lab: bench/REPORT.md, results.json, PNG"
	@echo "make gpu-check on a machine with NVIDIA GPUs: the GPU paths against the real driver"
	@echo "make gpu-check-bundle  the pure-Python libraries gpu-check needs, for a GPU machine"

# $(call apt_install,PACKAGES): install those of PACKAGES the host lacks, then touch the target.
define apt_install
@if [ "$$(id -u)" != 0 ]; then echo "make: run as root (the lab boots containers)" >&2; exit 1; fi
@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null \
	| grep -q 'install ok installed' || echo $$p; done); \
if [ -n "$$missing" ]; then \
	echo "installing host packages: $$missing"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends $$missing; \
fi
@mkdir -p $(STAMP) && touch $@
endef

deps: $(STAMP)/apt $(STAMP)/apt-browser
$(STAMP)/apt: Makefile
	$(call apt_install,$(APT_PACKAGES))

$(STAMP)/apt-browser: Makefile
	$(call apt_install,$(BROWSER_PACKAGES))

# The demo's image builder alone, first: the image then builds while the other host
# packages and the venv install (make demo).
$(STAMP)/image-builder: Makefile
	$(call apt_install,mmdebstrap)

# The five distributions under packages/ (docs/architecture.md), editable, with the
# ops side's dev tools.
DISTS := contract plugins client agent ops
PYPROJECTS := $(foreach d,$(DISTS),packages/$(d)/pyproject.toml)
EDITABLE := $(foreach d,contract plugins client agent,-e packages/$(d))

venv: $(VENV)/.installed $(STAMP)/apt-browser
$(VENV)/.installed: $(PYPROJECTS) $(STAMP)/apt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(EDITABLE) -e 'packages/ops[dev]'
	touch $@ $(VENV)/.runtime-installed

# What `make demo` runs needs only the runtime (ansible-core, tcloud, tacc-lab, Mitogen):
# not the dev tools (molecule, ansible-lint, pytest, numpy), not a newer pip (Debian 12's
# installs editable pyproject packages), and no isolated build env per distribution (the
# venv's setuptools 65 + wheel build them: setuptools>=61 is all they ask). Measured: 73 s
# against 179 s for the full venv. `make venv` (make test) adds the rest later.
$(VENV)/.runtime-installed: $(PYPROJECTS) $(STAMP)/apt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q wheel
	$(BIN)/pip install -q --no-build-isolation $(EDITABLE) -e packages/ops
	touch $@

# The bench scripts one after the other on the bench lab (about an hour, docs/bench.md);
# BENCH_ARGS=--quick for a labelled smoke run. The plot needs the `bench` extra.
.PHONY: bench
bench: venv $(VENV)/.bench-installed
	python -u bench/report.py $(BENCH_ARGS)

$(VENV)/.bench-installed: $(PYPROJECTS) $(VENV)/.installed
	$(BIN)/pip install -q $(EDITABLE) -e 'packages/ops[dev,bench]'
	touch $@

# Not part of `make test` (CI has no GPU): run it on a GPU machine, e.g. the device tool's.
# It needs no venv and no network: the machine's Python with PyTorch, and nvidia-smi.
gpu-check:
	$(PYTHON) tools/gpu_check.py

# What gpu-check imports beyond the GPU machine's Python, copied from the venv into
# .cache/gpu-check-site (the device tool carries it: that machine has no network).
gpu-check-bundle: $(VENV)/.runtime-installed
	$(VENV)/bin/python tools/gpu_check.py --bundle

# tacc-lab is in the runtime venv (`make venv` installs it too): `make lab-down` after
# `make demo` installs no dev tools.
lab-up: $(VENV)/.runtime-installed
	tacc-lab --name $(LAB_NAME) up --nodes $(LAB_NODES)
	tacc-lab --name $(LAB_NAME) status

lab-down: $(VENV)/.runtime-installed
	tacc-lab --name $(LAB_NAME) down

# The same steps as lab-up on the runtime venv, on the prebaked node image (the packages
# the roles install are in it: prebake.py; the roles still check and configure them), and
# the playbook over Mitogen (one Python per node for the whole run instead of one per
# task: bench/converge.py). The image builds while the other host packages and the venv
# install: python -m tacc_lab.image needs only mmdebstrap and the system Python. The
# playbook runs on the inventory `tacc-lab up` wrote, with no overrides, as the Slurm lab
# of the integration tests does: the package cache gets this machine's CPU-only wheels (pip
# find-links, tacc_lab/wheels.py), so the next example the demo names,
# examples/pytorch-ddp, completes on its first submit with the CPU torch build.
# Where the time goes: docs/demo-timing.md.
demo: export TACC_LAB_IMAGE_FLAVOR = prebaked
demo: $(STAMP)/image-builder
	@PYTHONPATH=packages/ops $(PYTHON) -m tacc_lab.image & image=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.runtime-installed || { wait $$image; exit 1; }; \
	wait $$image
	tacc-lab --name $(LAB_NAME) up --nodes $(LAB_NODES)
	tacc-lab --name $(LAB_NAME) status
	@echo "== provision the lab as a Slurm cluster (re-runs change nothing) =="
	ANSIBLE_STRATEGY=mitogen_linear ansible-playbook -i $(LAB_INVENTORY) playbooks/site.yml
	@echo "== the cluster at work =="
	tacc-lab --name $(LAB_NAME) ssh n1 sinfo
	tacc-lab --name $(LAB_NAME) ssh n1 srun -N2 hostname
	@echo "== a researcher (alice) submits examples/hello with tcloud and follows its logs =="
	TACC_LAB_NAME=$(LAB_NAME) python -m tacc_lab.demo examples/hello

LINT := ruff check . && ruff format --check . && ansible-lint --profile production --offline

lint: venv
	$(LINT)

# tests/unit: no ansible-playbook, no lab, no fresh venv (those are tests/playbook's and
# tests/integration's); make check runs it after lint.
check: lint unit

unit: venv
	pytest -q -n 2 tests/unit

# Real ansible-playbook runs (and fresh-venv installs) on this machine, no lab.
playbook: venv
	pytest -q -n 2 tests/playbook

integration: venv
	pytest -q -m lab tests/integration

# For role authors: every scenario (make test runs `default`, through pytest; `cluster`
# converges a 3-node lab of its own and runs here only: tests/integration/test_molecule.py).
molecule: venv
	molecule test --all

# Issue [20]'s site move (22.05 -> 24.11: playbooks/upgrade-export.yml, reinstall,
# site.yml, upgrade-import.yml) on a 3-node lab of its own; make test skips it (two
# 3-node converges do not fit its budget): tests/integration/test_release_upgrade.py.
upgrade-test: venv
	TACC_TEST_UPGRADE=1 pytest -q -s tests/integration/test_release_upgrade.py

# Every proof: molecule's default scenario runs inside pytest (tests/integration/test_molecule.py)
# beside the other labs; --dist loadfile is tests/conftest.py's scheduler there (one
# worker per lab shape, heaviest first). Three workers on two cores: the lab modules
# spend most of their time waiting on Slurm and their nodes, so a third overlaps them.
# Lint runs beside pytest (its minute overlaps the labs' boots; its output comes after
# pytest's), in a process group of its own that an interrupted run stops too: either
# failing fails the target. (Not `$(MAKE) lint`: make runs a line naming $(MAKE) even
# under -n, and this line holds the whole suite.)
test: venv
	@mkdir -p .cache && rm -f .cache/lint.log
	@echo "lint beside pytest: $(LINT)"
	setsid -w bash -c '$(LINT)' > .cache/lint.log 2>&1 & lint=$$!; \
	trap 'kill -- -$$lint 2>/dev/null || true' EXIT; \
	trap 'exit 130' INT TERM; \
	tests=0; pytest -q -n 3 --dist loadfile --durations=25 tests || tests=$$?; \
	linted=0; wait $$lint || linted=$$?; \
	cat .cache/lint.log; \
	if [ $$linted -ne 0 ]; then echo "make test: lint failed (above)" >&2; fi; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

clean: lab-down
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
