# Source this at the start of a command on the GPU machine (repo root as working directory):
#   source tools/bench/env.sh
# It installs the carried wheels (.device-wheels, made by the shared fetch-wheels.sh: torchtitan,
# torchdata, lm-eval, fla-core ...) and this project (editable, no deps, no build isolation: the image has
# setuptools but no registry), keeps NVLink multicast off, and prints the versions in use.
set -e
if [ -f .device-wheels/install.sh ]; then
  # shellcheck disable=SC1091
  source .device-wheels/install.sh
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install --quiet --no-deps --no-build-isolation --no-index -e . 2>&1 | grep -v -i warning || true
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, triton
import titan_delta_kernels  # noqa: F401  (fails loudly if the editable install did not work)
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"gpu_env: torch {torch.__version__}, triton {triton.__version__}, {name}, {torch.cuda.device_count()} GPU(s)")
PY
set +e
