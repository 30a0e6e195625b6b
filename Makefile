# Two commands for a fresh machine (Python 3.11+, Java 17):
#   make demo   install everything into .venv and run the main job on a local ring (the
#               driver-side connector, then Spark on local-cluster checkpointing to sr3://)
#   make test   install everything into .venv and run lint, types and the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
comma := ,
STAMP := $(VENV)/.installed

.PHONY: install demo test test-cluster test-containers test-standby test-rescale lint check bench faults rescale-kills clean jar

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,plot,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/sr3 demo
	$(VENV)/bin/sr3 demo --cluster

jar: install
	$(PY) -c "from spark_connector.jar import fs_jar; print(fs_jar())"

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q --durations=10 -m "not containers and not standby and not cluster and not rescale_matrix"

# Spark applications on local-cluster killed with two peers, or with their executors
# killed mid-commit (tests/test_spark_cluster.py, tests/test_spark_batch.py): minutes
# each. CI runs it after `make test`.
test-cluster: install
	$(PY) -m pytest -q --durations=5 -m cluster

# The hot standby's drills (tests/test_standby_drill.py, tests/test_standby_partition.py):
# Spark applications SIGKILLed with peers, or cut off in network namespaces (root). CI runs
# it after `make test`.
test-standby: install
	$(PY) -m pytest -q --durations=5 -m standby

# Every stateful operator x state store provider x direction rescaled through the ring and
# compared with a run never rescaled, and every refusal (tests/test_rescale_matrix.py):
# the better part of an hour on two cores; `make test` runs a representative few.
test-rescale: install
	$(PY) -m pytest -q --durations=10 -m rescale_matrix tests/test_rescale_matrix.py

# The compose deployment on a real container engine (tests/test_compose_engine.py): builds
# a base image from Debian's archive the first time (root, debootstrap), then the
# project's image, and runs the ring in containers. CI runs it after `make test`.
test-containers: install
	$(PY) -m pytest -q --durations=5 -m containers

bench: install
	$(PY) benchmarks/bench_placement.py
	$(PY) benchmarks/bench_store.py
	$(PY) benchmarks/bench_repair.py
	$(PY) benchmarks/bench_connector.py

# The fault lab's scenarios (tests/faultlab.py) over many seeds and longer than `make test`
# runs them, as root (network namespaces, nftables); report in benchmarks/results/faults.json.
#   make faults [SR3_FAULT_SEEDS=20] [SR3_FAULT_SCALE=2] [SR3_FAULT_NEMESES=bridge,flapping]
SR3_FAULT_SEEDS ?= 20
SR3_FAULT_SCALE ?= 2
SR3_FAULT_NEMESES ?=
faults: install
	$(PY) benchmarks/fault_runs.py --seeds $(SR3_FAULT_SEEDS) --scale $(SR3_FAULT_SCALE) \
		$(foreach nemesis,$(subst $(comma), ,$(SR3_FAULT_NEMESES)),--nemesis $(nemesis))

# A rescale through the ring SIGKILLed at a random moment, 10 rounds (make test runs 2):
# after each, the ring's newest batch runs at the old or the new count.
SR3_RESCALE_KILL_ROUNDS ?= 10
rescale-kills: install
	SR3_RESCALE_KILL_ROUNDS=$(SR3_RESCALE_KILL_ROUNDS) $(PY) -m pytest -q \
		tests/test_rescale.py -k killed_at_any_moment

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
