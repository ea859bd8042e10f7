# The two set-up commands of the README: `make demo` and `make test`. Each creates .venv,
# installs slurm-horus into it and installs the Debian packages for the local Slurm cluster.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-unit bench deps venv clean

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

# Benchmarks that need neither ../shared/data nor a long run; the others are run one by one
# (see the docstring at the top of each bench/bench_*.py).
BENCH_SELF_CONTAINED = bench/bench_horusd.py bench/bench_pin_vs_leave.py bench/bench_localcluster.py \
	bench/bench_submit_overhead.py bench/bench_failopen.py bench/bench_sbatch.py bench/bench_attacks.py

bench: $(STAMP) deps
	for b in $(BENCH_SELF_CONTAINED); do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
