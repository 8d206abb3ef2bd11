#!/usr/bin/env bash
# The GPU check on a CUDA machine that has torch but no package index (the project's own
# dependencies are not installed there), in one call of at most 8 minutes: install the wheels
# `make gpu-wheels` put in .whl/ (gpu/device_site.sh), then run `python -m gpu.check`
# from this checkout with that machine's python3 (CUDA tests, the sink probe at 16k and 64k,
# paper-200m Baseline and SMELT compiled and interleaved: 7 minutes of parts at most). The JSON
# record goes to $OUT/gpu_check.json ($OUT: the device tool's output folder;
# /tmp without one). Extra arguments go to gpu_check (e.g. --only tests,sink). PYTHON,
# SMELT_WHEELS (default .whl) and SMELT_SITE (default /tmp/smelt-site) override the defaults.
set -euo pipefail
source "$(dirname "$0")/device_site.sh"
exec "$py" -m gpu.check --out "${OUT:-/tmp}/gpu_check.json" "$@"
