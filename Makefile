# rig: the two set-up commands are `make provision` and `make test`; each
# installs what it needs itself (a virtualenv, a Docker engine, the base image).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV ?= .venv
STACK ?= stacks/default.yml
BOX ?= rig-box
# FRESH=0 re-runs on the box left by the last `make provision` instead of a new one.
FRESH ?= 1
# LOOP=0 gives the box no loop devices: the python_stack role then unpacks the venv archive instead of mounting its image.
LOOP ?= 1
export RIG_CACHE ?= $(HOME)/.cache/rig
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help venv docker image-tools base-image provision test test-quick unit lint lint-ansible lint-python lint-ci bench clean-box

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# uv installs the tools (seconds where pip took two minutes), at the version rig pins for hosts; then their
# bytecode, as pip would write it: without, every ansible-playbook, rig and pytest start compiles what it imports.
# Not of the ansible package's collections other than the two that run (community.docker for the boxes,
# ansible.posix's json callback in tests): the rest are three quarters of the venv's modules (install 36.1 -> 22.8
# CPU-s, docs/BENCHMARKS.md).
UV_VERSION := $(shell sed -n 's/^UV_VERSION = "\(.*\)"/\1/p' rig/python/installer.py)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --upgrade pip -e '.[test]'
	$(VENV)/bin/python -m compileall -q -j 0 -x '/ansible_collections/(?!community/docker/|ansible/posix/)' $(VENV)/lib
	touch $@

venv: $(VENV)/.installed  ## Create the virtualenv with rig and its pinned tools

docker:  ## Make sure a Docker engine answers (installs docker.io as root if needed)
	bash scripts/ensure-docker.sh

image-tools:  ## Make sure this controller can image a venv archive (installs zstd and squashfs-tools as root if needed)
	bash scripts/ensure-image-tools.sh

base-image: docker  ## Build or reuse the base image boxes start from
	bash scripts/base-image.sh

provision: venv docker image-tools  ## Provision a throwaway local box with STACK, then run rig doctor in it
	@# the box and the stack in one ansible-playbook run: one start of Ansible, not two
	image=$$(bash scripts/base-image.sh) && \
	  ansible-playbook -i inventory/local playbooks/local-box.yml playbooks/site.yml -e rig_stack=$(STACK) \
	    -e rig_box_image=$$image -e rig_box_name=$(BOX) -e rig_box_fresh=$(FRESH) -e rig_box_loop=$(LOOP)
	rig doctor --container $(BOX) --stack $(STACK)
	@echo "make provision: rig is $(VENV)/bin/rig; put it on the PATH with: . $(VENV)/bin/activate"

# The quick tests answer first (no Docker engine, no venv install), then the boxes; the lint gates, the
# Docker engine and the base image come up beside the quick tests, in the CPU their waits leave (tests
# that wait on a server), their output after the tests' own; any of the three failing stops the run
# before the boxes. Each pytest run leaves a JUnit file under build/ and lists its slowest tests. WORKERS pytest-xdist
# workers share each run: quick tests spread one by one, box tests by the state they share (a module's
# boxes, the lab, the image store: one worker each, tests/harness/worker_groups.py).
WORKERS ?= 4
PYTEST := pytest -ra --durations=25 -n $(WORKERS)
# --maxschedchunk 1: one test at a time to whichever worker is free; by default each worker starts with a
# run of consecutive tests, and the first one held every slow quick test (validate, bench, tune) in turn
QUICK := $(PYTEST) --dist load --maxschedchunk 1 -m 'not box and not venv'
BOXES := $(PYTEST) --dist loadscope -m 'box or venv'
test: venv image-tools  ## Run the whole suite: quick tests and the lint gates, then role scenarios and end to end in boxes
	mkdir -p build && rm -f build/gates.log  # a new file: never written through what stood there
	$(MAKE) --no-print-directory lint base-image > build/gates.log 2>&1 & gates=$$!; \
	  quick=0; $(QUICK) --junitxml=build/junit-quick.xml tests || quick=$$?; \
	  gated=0; wait $$gates || gated=$$?; cat build/gates.log; \
	  if [ $$gated -ne 0 ]; then echo "make test: the lint gates or the Docker engine failed (above)" >&2; fi; \
	  [ $$quick -eq 0 ] && [ $$gated -eq 0 ]
	@# the box run's disk: where its temporary files and its boxes go, and how much room each has left
	df -h /tmp "$$(docker info -f '{{.DockerRootDir}}')"
	export RIG_BASE_IMAGE=$$(bash scripts/base-image.sh) && \
	  $(BOXES) --junitxml=build/junit-boxes.xml tests

test-quick: venv lint  ## The fast loop: the lint gates, then the tests that need no Docker engine
	$(QUICK) --junitxml=build/junit-quick.xml tests

unit: venv  ## Run only the tests that need no Docker engine
	$(QUICK) tests

# The three gates run side by side (ansible-lint alone takes about 20 s), each one's output kept together.
lint: venv  ## ansible-lint (production profile), ruff, mypy, rig's layers, and the example CI workflows' schemas
	$(MAKE) --no-print-directory --jobs=3 --output-sync=target lint-ansible lint-python lint-ci

lint-ansible: venv
	ansible-playbook -i inventory/local --syntax-check playbooks/*.yml  # one start-up for all of them
	ansible-lint -q

lint-python: venv
	ruff check rig tests scripts roles
	mypy
	pytest -q -p no:cacheprovider tests/unit/test_layers.py  # each layer imports only those before it

lint-ci: venv
	check-jsonschema --builtin-schema vendor.github-workflows docs/ci/github-actions.yml
	check-jsonschema --builtin-schema vendor.gitlab-ci docs/ci/gitlab-ci.yml

# BENCH=provision or BENCH=lock runs one of them.
BENCH ?= provision installer lock wheels client image hostile checks cubins tasks
bench: venv docker  ## Run the benchmarks and update docs/BENCHMARKS.md (see scripts/bench.py)
	for b in $(BENCH); do python scripts/bench.py $$b; done

clean-box:  ## Remove the local box
	docker rm -f $(BOX)
