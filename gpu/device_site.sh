# Sourced by the device scripts (gpu/check_on_device.sh, gpu/lm_pair_on_device.sh) on a CUDA
# machine that has torch but no package index: installs the wheels `make gpu-wheels` put in
# .whl/ into a scratch folder and puts it and this checkout on PYTHONPATH. Sets `py` (PYTHON,
# default python3). SMELT_WHEELS (default .whl) and SMELT_SITE (default /tmp/smelt-site)
# override the defaults. Then prints torch's version, CUDA's and the GPU's name.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
site=${SMELT_SITE:-/tmp/smelt-site}
shopt -s nullglob
wheels=("${SMELT_WHEELS:-.whl}"/*.whl)
if ((${#wheels[@]})); then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$py" - <<'PY'
import torch

gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}")
PY
