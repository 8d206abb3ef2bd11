#!/usr/bin/env bash
# The offline GPU check's dry run in a simulation of the GPU machine's Python environment, on a
# CPU machine: a Python 3.12 virtualenv holding exactly the packages of
# gpu/device_packages.txt (installed --no-deps, so nothing else comes in), then what
# `make gpu-wheels` fetches (gpu/wheels.txt), installed by
# gpu/check_on_device.sh as on the device, from install to the printed plan; then the
# model, the trainer, every probe and transformer-lens (with transformers) imported there, a
# hooked run and a training step on the CPU, and tests/gpu/test_cuda.py's logic on the CPU under
# that torch. `make gpu-sim` runs it: about 4 GB and 10 minutes the first time, then 1 minute.
#
# PYTHON312 (default: python3.12 on PATH, else a 3.12 that pyenv holds), SMELT_SIM (the environment,
# default /tmp/smelt-device-sim; kept, and rebuilt only when the package list changes),
# SMELT_WHEELS (default .whl) override the defaults. The first build downloads about 4 GB (torch
# 2.11.0 is PyPI's CUDA 13.0 build, with its nvidia-* libraries, as on the device).
set -euo pipefail
cd "$(dirname "$0")/.."
# The device runs Python 3.12: PYTHON312, else python3.12 on PATH, else a 3.12 that pyenv holds.
py312=${PYTHON312:-python3.12}
if ! "$py312" --version >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
  py312="$(pyenv root)/versions/$(pyenv versions --bare | grep -m1 '^3\.12')/bin/python"
fi
"$py312" --version >/dev/null 2>&1 || { echo "error: no Python 3.12 here; set PYTHON312" >&2; exit 2; }
sim=${SMELT_SIM:-/tmp/smelt-device-sim}
wheels=${SMELT_WHEELS:-.whl}
list=gpu/device_packages.txt
stamp=$(sha256sum "$list" | cut -d' ' -f1)
export PIP_CONSTRAINT="" PIP_DISABLE_PIP_VERSION_CHECK=1  # no cap from this machine's pip config

if [[ "$(cat "$sim/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "== building $sim from $list ($(grep -vc '^#' "$list") packages)"
  rm -rf "$sim"
  "$py312" -m venv "$sim"
  "$sim/bin/python" -m pip install -q --no-deps --only-binary=:all: -r "$list"
  rm -f "$sim/.torch-pins"
fi
if [[ ! -f "$sim/.torch-pins" ]]; then
  # A name the list gives no version for got the registry's newest; where torch 2.11.0 pins one
  # (its CUDA libraries, setuptools), the machine has torch's, as torch came with them.
  "$sim/bin/python" - >"$sim/torch-pins.txt" <<'PY'
import importlib.metadata as md

from packaging.requirements import Requirement

listed = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
for text in md.requires("torch") or []:
    req = Requirement(text)
    if req.name.lower() in listed and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(f"{req.name}{req.specifier}")
PY
  echo "== torch's own pins: $(tr '\n' ' ' <"$sim/torch-pins.txt")"
  "$sim/bin/python" -m pip install -q --no-deps --only-binary=:all: -r "$sim/torch-pins.txt"
  touch "$sim/.torch-pins"
  echo "$stamp" >"$sim/.stamp"
fi
"$sim/bin/python" -m pip check | sed 's/^/  pip check: /' || true
echo "== $("$sim/bin/python" --version), $("$sim/bin/python" -m pip list 2>/dev/null | tail -n +3 | wc -l) packages"

missing=$(grep -v '^#' gpu/wheels.txt | while read -r spec; do
  name=$(echo "${spec%%==*}" | tr '-' '_')
  compgen -G "$wheels/${name}-${spec##*==}-*.whl" >/dev/null || echo "$spec"
done)
if [[ -n "$missing" ]]; then
  echo "== fetching into $wheels: $(echo $missing)"
  make -s gpu-wheels PYTHON="$sim/bin/python"
fi

site=$(mktemp -d /tmp/smelt-sim-site.XXXX)
out=$(mktemp -d /tmp/smelt-sim-out.XXXX)
trap 'rm -rf "$site" "$out"' EXIT
echo "== gpu/check_on_device.sh --dry-run in the simulated environment"
PYTHON="$sim/bin/python" SMELT_WHEELS="$wheels" SMELT_SITE="$site" OUT="$out" \
  bash gpu/check_on_device.sh --dry-run

echo "== imports and a tiny CPU run there"
PYTHONPATH="$site:$PWD" "$sim/bin/python" - <<'PY'
import importlib
import pkgutil

import torch
import transformer_lens
import transformers

import smelt_interp.probes as probes
from smelt_interp.config import ModelConfig
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer

for info in pkgutil.iter_modules(probes.__path__):
    importlib.import_module(f"smelt_interp.probes.{info.name}")
# transformer-lens 4's bridge over transformers' models: loads transformers' model code
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402,F401
import sys  # noqa: E402

assert "transformers.modeling_utils" in sys.modules, "the bridge did not load transformers"

from importlib.metadata import version  # noqa: E402

print(
    f"torch {torch.__version__}, transformers {transformers.__version__}, transformer-lens "
    f"{version('transformer-lens')}, nnsight {version('nnsight')}"
)
cfg = ModelConfig.smelt(
    d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=4, top_k=2,
    d_expert=16, max_seq_len=32,
)  # fmt: skip
model = SmeltModel(cfg)
tokens = torch.randint(0, 256, (2, 16))
_, cache = model.run_with_cache(tokens, names_filter=model.hook_names("attn.hook_q"))
assert len(cache) == len(model.schedule)
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    tc = TrainConfig.from_dict({**get_preset("dyck-pair-tiny"), "steps": 1, "threads": 1})
    trainer = Trainer(tc, tmp, progress=False)
    loss = trainer.train_step(tc.lr)["loss"]
print(f"model, trainer and {len(list(pkgutil.iter_modules(probes.__path__)))} probe modules "
      f"import; hooked run ok, one training step loss {loss:.3f}")
PY
echo "== the CUDA tests' logic on the CPU there (torch 2.11, as the check's tests part runs them)"
SMELT_CUDA_TESTS_DEVICE=cpu PYTHONPATH="$site:$PWD" "$sim/bin/python" -m pytest -q \
  -p no:cacheprovider tests/gpu/test_cuda.py
echo "== the simulated device environment passes"
