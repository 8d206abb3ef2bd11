#!/usr/bin/env bash
# Where paper-200m's training step spends its time, on a CUDA machine that has torch but no
# package index, in one call of at most 9 minutes: install the wheels `make gpu-wheels` put in
# .whl/ (gpu/device_site.sh), then `python -m benchmarks.gpu_perf` from this checkout (env,
# attention, experts, profile, A/B of the kernel switches: 480 s of parts at most; `timeout`
# stops anything past 530). The JSON goes to $OUT/gpu_perf.json ($OUT: the device tool's output
# folder; /tmp without one), rewritten after each part. Extra arguments go to gpu_perf (e.g.
# --only env,ab, --dry-run). PYTHON, SMELT_WHEELS, SMELT_SITE as in device_site.sh.
set -euo pipefail
source "$(dirname "$0")/device_site.sh"
exec timeout --signal=KILL 530 "$py" -m benchmarks.gpu_perf --out "${OUT:-/tmp}/gpu_perf.json" "$@"
