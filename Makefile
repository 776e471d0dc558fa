# Every target creates .venv on first use, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench figures clean

$(STAMP): pyproject.toml
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

test: lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

figures: $(STAMP)
	$(BIN)/python -m bench.figures --out docs/figures

# The cluster secret of compose/ (peer authentication; compose/README.md): a random line, mode
# 600, created only if missing (delete the file first to rotate it); .gitignore keeps it out of git.
.PHONY: compose-secret
compose-secret: compose/cluster_secret

compose/cluster_secret: | $(STAMP)
	$(BIN)/python -c "from cluster.auth import write_secret; write_secret('$@')"
	@echo "created $@ (mode 600); the nodes run as uid 10001: with a Linux engine also run" \
		"'sudo chown 10001 $@' (compose/README.md)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
