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
# $(SLURM_DIR), run tests/slurm (srun on ddpipe train and a user script, sbatch on the examples), stop it.
test-slurm: $(STAMP)
	tests/slurm/cluster.sh install
	tests/slurm/cluster.sh stop $(SLURM_DIR); rm -rf $(SLURM_DIR)
	tests/slurm/cluster.sh start $(SLURM_DIR)
	SLURM_CONF=$(SLURM_DIR)/slurm.conf PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -rs tests/slurm; \
	  status=$$?; tests/slurm/cluster.sh stop $(SLURM_DIR); exit $$status

# The main job end to end on a generated dataset: synth -> convert to every format -> verify -> inspect.
demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m ddpipe.demo --out $(DEMO) --n $(DEMO_N)

# each record's own command; feed.py and plan_time.py are set against an earlier checkout, so are run by hand
bench: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/formats.py --n 3000 --repeats 9 --shard-size 64MB
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/lmdb_tree.py --n 3000 --repeats 7
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/random_access.py --n 3000 --share 8 --repeats 5
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/shuffle_quality.py --ranks 4 --classes 100 --per-class 50
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/exchange.py --n 3000 --ranks 2 4 8 --repeats 31 --round-size 128 512 --torchrun-ranks 2 4 8 --slow-source 600MB/s
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/loader.py --n 3000 --repeats 3 --warmup 4
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/staging.py --n 3000 --ranks 2 --throttle 100MB/s,5ms --reshard-throttle 25MB/s,5ms --repeats 3
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/projection.py --n 3000 --throttle 50MB/s,5ms --repeats 3
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/allreduce.py --ranks 2 --repeats 7
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/decode_service.py --images 2000 --batch-size 64 --repeats 3
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/object_store.py --n 4000 --latency-ms 20 --bandwidth 100MB/s --repeats 3
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/soak.py --n 1000 --epochs 20 --ranks 2
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/peer_staging_soak.py --runs 30 --n 480
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/plan.py --world-size 2048 --batch-size 32
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/shuffle_accuracy.py --worlds 16 64 256 1024 --seeds 3 --epochs 8
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/shuffle_accuracy.py --buffer-study 16 --seeds 3 --epochs 8
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
