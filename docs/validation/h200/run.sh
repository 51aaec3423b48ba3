#!/usr/bin/env bash
# GPU evidence for `rig doctor`: run on the lent H200 machine (driver + CUDA 13.0,
# no internet) from the repository root, with the engine bundle carried along:
#   rig plumbing bundle --output build/rig.pyz   (here), then on the GPU machine:
#   bash docs/validation/h200/run.sh "$OUT"
# It runs doctor as the machine comes, then once more after the cuda_ldconfig
# role's engine step (the same ld.so.conf.d file the role writes, then ldconfig).
set -uo pipefail
out=${1:?output dir}
RIG_SRC=$PWD/build/rig.pyz  # python3 imports rig from the zipapp as from a folder
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
{
  echo "## uname -a; nvidia-smi -L"; uname -a; nvidia-smi -L
  echo "## toolkits"; ls -d /usr/local/cuda* ; readlink -f /usr/local/cuda
  echo "## ldconfig -p | grep -E 'libcudart|libnvrtc'"; ldconfig -p | grep -E 'libcudart|libnvrtc'
} >"$out/machine.txt" 2>&1
rig doctor --json --cuda 13.0.2 --arch 12.0a --arch 9.0a >"$out/doctor-as-found.json"
echo "doctor as found: exit $?"
rig ldconfig-conf --json --version 13.0.2 >"$out/ldconfig-conf.json"
python3 - "$out/ldconfig-conf.json" <<'PY'
import json, sys
conf = json.load(open(sys.argv[1]))
open(conf["path"], "w").write(conf["content"])
PY
ldconfig
rig doctor --json --cuda 13.0.2 --arch 12.0a --arch 9.0a >"$out/doctor.json"
echo "doctor after the ldconfig step: exit $?"
rig doctor --cuda 13.0.2 --arch 12.0a --arch 9.0a | tee "$out/doctor.txt"
