#!/usr/bin/env bash
# The language-model pair on a CUDA machine that has torch but no package index, in one call of
# at most 9 minutes: install the wheels `make gpu-wheels` put in .whl/ (gpu/device_site.sh),
# then `python -m gpu.lm_pair` from this checkout: the machine's own text into BPE shards,
# lm-pair-gpu's Baseline and SMELT trained on them, the section-6 probes on both (520 s of parts
# at most; `timeout` stops anything past 530). The JSON goes to $OUT/lm_pair.json with the
# metrics logs (and any checkpoint under the device tool's 16 MiB limit) beside it ($OUT: the
# device tool's output folder; /tmp/smelt-lm-pair-out without one). Extra arguments go to
# gpu.lm_pair (e.g. --sequential, --work DIR). PYTHON, SMELT_WHEELS, SMELT_SITE as in
# device_site.sh.
set -euo pipefail
source "$(dirname "$0")/device_site.sh"
out=${OUT:-/tmp/smelt-lm-pair-out}
mkdir -p "$out"
exec timeout --signal=KILL 530 "$py" -m gpu.lm_pair --out "$out/lm_pair.json" --collect "$out" "$@"
