# Every target sets up what it needs on a fresh machine: a virtual environment in .venv,
# torch first (pinned, so pip takes the local CPU build rather than several GB of CUDA wheels),
# then ddpipe with its MPI, DALI, decode-service and development extras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ddpipe-installed
DEMO   ?= demo-data
DEMO_N ?= 600

SLURM_DIR ?= /tmp/ddpipe-slurm

.PHONY: setup test test-slurm lint typecheck demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[mpi,dali,service,dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check ddpipe tests benchmarks examples
	$(PY) benchmarks/report.py --check

typecheck: $(STAMP)
	$(VENV)/bin/mypy ddpipe tests benchmarks examples

test: lint typecheck
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q

# Real Slurm on this machine: install slurm-wlm and munge (root, apt), start a two-node cluster under
# $(SLURM_DIR), run tests/slurm (srun on ddpipe train and a user script, sbatch on the example), stop it.
test-slurm: $(STAMP)
	tests/slurm/cluster.sh install
	tests/slurm/cluster.sh stop $(SLURM_DIR); rm -rf $(SLURM_DIR)
	tests/slurm/cluster.sh start $(SLURM_DIR)
	SLURM_CONF=$(SLURM_DIR)/slurm.conf PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -rs tests/slurm; \
	  status=$$?; tests/slurm/cluster.sh stop $(SLURM_DIR); exit $$status

# The main job end to end on a generated dataset: synth -> convert to every format -> verify -> inspect.
demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m ddpipe.demo --out $(DEMO) --n $(DEMO_N)

bench: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/formats.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/lmdb_tree.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/random_access.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/shuffle_quality.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/exchange.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/loader.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/staging.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/projection.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/allreduce.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/decode_service.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/soak.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/peer_staging_soak.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/shuffle_accuracy.py --ranks 4
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/shuffle_accuracy.py --ranks 8
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
