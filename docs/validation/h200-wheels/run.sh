#!/usr/bin/env bash
# GPU evidence for `rig wheels build` and `rig audit` (run on the lent H200 from the repo root).
# Builds tests/data/rig_scale_ext for sm_90a against this machine's own torch with the
# machine's nvcc 13, audits it, imports it and compares its result with torch's.
set -euo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
exec > >(tee "$out/wheels-h200.log") 2>&1
RIG_SRC=$PWD/build/rig.pyz  # python3 imports rig from the zipapp as from a folder
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
nvcc --version | tail -2
venv=${RIG_H200_VENV:-/opt/torch/.venv}   # the machine's own torch
$venv/bin/python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
rig wheels build tests/data/rig_scale_ext --venv $venv --stack docs/validation/h200-stack.yml \
  --cuda-home /usr/local/cuda --cache /tmp/rig-cache --json > "$out/build.json"
wheel=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["wheel"])' "$out/build.json")
echo "built: $wheel"
rig audit "$wheel" --venv $venv --stack docs/validation/h200-stack.yml --cache /tmp/rig-cache
rig audit "$wheel" --venv $venv --stack docs/validation/h200-stack.yml --cache /tmp/rig-cache --json > "$out/audit.json"
echo "the same wheel held to an SM120 stack must fail (it carries sm_90a only):"
if rig audit "$wheel" --venv $venv --stack stacks/default.yml --cache /tmp/rig-cache; then
  echo "UNEXPECTED: the audit passed"; exit 1
fi
$venv/bin/python -m pip install --no-deps --no-index -q "$wheel"
$venv/bin/python - <<'PY'
import torch, rig_scale_ext
torch.manual_seed(0)
x = torch.randn(1 << 20, device="cuda"); y = torch.randn(1 << 20, device="cuda")
got = rig_scale_ext.scale_add(x, y, 1.5)
want = 1.5 * x + y
torch.cuda.synchronize()
diff = (got - want).abs().max().item()
print(f"scale_add on {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))}): "
      f"{x.numel()} elements, max |rig_scale_ext - torch| = {diff}")
# nvcc fuses alpha * x + y into one FMA (one rounding), torch rounds twice: allow 1 ulp
assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), diff
print("GPU result matches torch (within one float32 rounding: the kernel uses a fused multiply-add)")
PY
