# Every target creates .venv on first use, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-all figures clean sim

# setup.py and the kernel's sources too: an editable install compiles the FBF kernel once
$(STAMP): pyproject.toml setup.py cluster/core/fbf/_kernel.pyx cluster/core/fbf/_murmur3.h
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m cluster.fbf_demo
	$(BIN)/python -m client.chaos --duration 20 --out .demo-chaos

lint: $(STAMP)
	$(BIN)/ruff check cluster client tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite as two pytest processes side by side (tests/split_run.py): the SIDE_TESTS files mostly
# wait on real node processes (membership moves, compose, the hostile run, the benchmarks' smoke
# run), the others mostly compute, so on two cores they overlap instead of queueing. The chaos
# runs, whose throughput floors and nemesis schedules need the cores, stay in the main process.
# `make test PYTEST_SPLIT=0` runs the suite as one process.
SIDE_TESTS := tests/test_chaos_membership.py tests/test_membership_cluster.py tests/test_compose.py \
	tests/test_hostile.py tests/test_bench_smoke.py tests/test_clock_skew.py
PYTEST_SPLIT ?= 1

test: lint
ifeq ($(PYTEST_SPLIT),0)
	$(BIN)/python -m pytest -q
else
	$(BIN)/python tests/split_run.py $(SIDE_TESTS)
endif

# The deterministic simulator's long sweep (not part of `make test`; docs/sim.md).
SIM_SEEDS ?= 1..500
SIM_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
sim: $(STAMP)
	$(BIN)/python -m cluster.sim --seeds $(SIM_SEEDS) --ops 200 --jobs $(SIM_JOBS)

# The headline numbers (a few minutes): docs/benchmarks.md and the README's table, with the date,
# the commit and the machine. `make bench-all` runs every benchmark and prints their tables.
bench: $(STAMP)
	$(BIN)/python -m bench --report

bench-all: $(STAMP)
	$(BIN)/python -m bench

figures: $(STAMP)
	$(BIN)/python -m bench.figures --out docs/figures

# The cluster secret of compose/ (peer authentication; compose/README.md): a random line, mode
# 600, created only if missing (delete the file first to rotate it); .gitignore keeps it out of git.
.PHONY: compose-secret
compose-secret: compose/cluster_secret

# Python's standard library only (no venv): what cluster.auth.write_secret writes.
SECRET_PY := import os, secrets, sys; \
	fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600); \
	os.write(fd, secrets.token_urlsafe(32).encode() + b"\n"); os.close(fd)

compose/cluster_secret:
	$(PY) -c '$(SECRET_PY)' $@
	@echo "created $@ (mode 600); the nodes run as uid 10001: with a Linux engine also run" \
		"'sudo chown 10001 $@' (compose/README.md)"

# The Kubernetes Secret's file (deploy/k8s/kustomization.yaml's secretGenerator; not in git).
.PHONY: k8s-secret
k8s-secret: deploy/k8s/cluster_secret

deploy/k8s/cluster_secret:
	$(PY) -c '$(SECRET_PY)' $@
	@echo "created $@; kubectl apply -k deploy/k8s turns it into the Secret (docs/containers.md)"

# compose/docker-compose.yml under a real engine, end to end (build, up, healthy, chaos through
# the proxies, kill -9 and pause of node containers, restart policy, down -v): compose/check.py.
# Needs docker and docker-compose (or the compose plugin); not part of `make test`.
.PHONY: compose-check
compose-check: $(STAMP)
	$(BIN)/python compose/check.py

# A rolling upgrade from a release, under load (client/chaos/upgrade.py, docs/chaos.md):
# the release's tree (git archive) and a venv of its own (its kernels compiled) in .upgrade/,
# built once per release and reused, then the play on each of UPGRADE_SEEDS; each must print
# VALID. UPGRADE_FROM is any release tag: v0.4.0 (the default) or v0.5.0; the play learns what
# each side speaks. Not part of `make test`, whose tests/test_upgrade.py is a short form of it.
UPGRADE_FROM ?= v0.4.0
UPGRADE_SEEDS ?= 1 2 3
UPGRADE_ARGS ?= --rate 200 --phase-seconds 6 \
	--nemesis lost-ack,duplicate,late-duplicate,delay,drop,reset,partition,peer-messages
UPGRADE_TREE := .upgrade/$(UPGRADE_FROM)
UPGRADE_VENV := .upgrade/venv-$(UPGRADE_FROM:v%=%)
.PHONY: upgrade-check
upgrade-check: $(STAMP) $(UPGRADE_VENV)/.installed
	@failed=""; for seed in $(UPGRADE_SEEDS); do \
		echo "== upgrade from $(UPGRADE_FROM) to this tree, seed $$seed"; \
		$(BIN)/python -m client.chaos.upgrade --old-tree $(UPGRADE_TREE) \
			--old-python $(UPGRADE_VENV)/bin/python --seed $$seed $(UPGRADE_ARGS) \
			--out .upgrade/out-$(UPGRADE_FROM)-$$seed || failed="$$failed $$seed"; \
	done; \
	if [ -n "$$failed" ]; then echo "upgrade-check: FAILED on seed(s)$$failed"; exit 1; fi; \
	echo "upgrade-check: VALID on seeds $(UPGRADE_SEEDS)"

$(UPGRADE_VENV)/.installed:
	rm -rf $(UPGRADE_TREE) $(UPGRADE_VENV)
	mkdir -p $(UPGRADE_TREE)
	git archive $(UPGRADE_FROM) | tar -x -C $(UPGRADE_TREE)
	$(PY) -m venv $(UPGRADE_VENV)
	$(UPGRADE_VENV)/bin/pip install --quiet --upgrade pip
	$(UPGRADE_VENV)/bin/pip install --quiet -e $(UPGRADE_TREE)
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
