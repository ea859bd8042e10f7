# The two set-up commands of the README: `make demo` and `make test`. Each creates .venv,
# installs slurm-horus into it and installs the Debian packages for the local Slurm cluster.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-unit test-slurm test-slurm-newer bench deps venv clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

venv: $(STAMP)

deps:
	bash scripts/ensure-debian-deps.sh

demo: $(STAMP) deps
	$(VENV)/bin/horus demo

test: $(STAMP) deps
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -q -m 'not slurm and not slurmdbd' $(PYTEST_ARGS)

# The Slurm-backed tests on a newer Slurm (SLURM=24.11 or 26.05) from a Debian chroot that the first
# run builds with mmdebstrap (1-3 minutes, once; see docs/local-cluster.md). test-slurm-newer runs
# them on both; `make test` runs everything on the system's Slurm (Debian 12: 22.05).
SLURM ?= 24.11
SLURM_NEWER = 24.11 26.05

test-slurm: $(STAMP) deps
	bash scripts/ensure-debian-deps.sh mmdebstrap
	$(VENV)/bin/horus local-cluster prepare --slurm $(SLURM)
	HORUS_LOCAL_SLURM=$(SLURM) $(PY) -m pytest -q -m 'slurm or slurmdbd' $(PYTEST_ARGS)

test-slurm-newer: $(STAMP)
	status=0; for v in $(SLURM_NEWER); do $(MAKE) --no-print-directory test-slurm SLURM=$$v || status=1; done; exit $$status

# Benchmarks that need neither ../shared/data nor a long run; the others are run one by one
# (see the docstring at the top of each bench/bench_*.py).
BENCH_SELF_CONTAINED = bench/bench_horusd.py bench/bench_pin_vs_leave.py bench/bench_localcluster.py \
	bench/bench_submit_overhead.py bench/bench_failopen.py bench/bench_sbatch.py bench/bench_attacks.py

bench: $(STAMP) deps
	for b in $(BENCH_SELF_CONTAINED); do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
