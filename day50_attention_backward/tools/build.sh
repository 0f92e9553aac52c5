# Sourced by the day50 tools run on a GPU machine: builds and installs common and day50
# (sm_90a, MAX_JOBS 16 unless set) from the checkout holding this folder, and prints the
# time it took. Leaves the shell in day50_attention_backward/; exits on a failed build.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root/common" && python3 -m pip install -q --no-build-isolation --no-deps . || exit 1
cd "$root/day50_attention_backward" || exit 1
t0=$(date +%s)
MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
  python3 -m pip install -q --no-build-isolation --no-deps . || exit 1
echo "== day50 built in $(( $(date +%s) - t0 )) s"
