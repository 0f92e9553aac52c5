#!/usr/bin/env bash
# One call on the GPU machine for the SIMT fused kernels (csrc/flash_simt.cu): build common and
# day50 only, run the SIMT tests and the test.py tests whose float32 / odd-head-dim /
# deterministic inputs now take those kernels, then time SIMT against naive and SDPA in float32.
#
#   bash day50_attention_backward/tools/gpu_simt.sh [ROOT]     (ROOT: the repo, default this one)
#
# KC_SIMT_TESTS="-k expr" picks the test.py tests (" ": all of them), KC_SIMT_PY_TIMEOUT their time
# limit in seconds; KC_SIMT_BENCH=0 skips the accuracy and timing tables.
# Logs go to $OUT (set by the device tool) when it is set.
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
ROOT=$(cd "$ROOT" && pwd)
OUT=${OUT:-$ROOT/build/out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
(cd "$ROOT/common" && python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build-common.log" 2>&1) \
  || { tail -30 "$OUT/build-common.log"; exit 1; }
(cd "$ROOT/day50_attention_backward" && python3 -m pip install -q --no-build-isolation --no-deps . \
  >"$OUT/build-day50.log" 2>&1) || { grep -m20 -B2 -A8 "error" "$OUT/build-day50.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
cd "$ROOT/day50_attention_backward"
t0=$(date +%s)
timeout 200 python3 -m pytest test_simt.py -q -n 8 -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/test_simt.log"
echo "test_simt: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout ${KC_SIMT_PY_TIMEOUT:-150} python3 -m pytest test.py -q -n 8 -p no:cacheprovider \
  ${KC_SIMT_TESTS:--k "exact or odd_head or deterministic or layouts or empty or bad_input or gqa_autograd or zero_stride or outputs_follow"} \
  2>&1 | tail -25 | tee "$OUT/test_py.log"
echo "test.py subset: $(( $(date +%s) - t0 )) s"
[[ ${KC_SIMT_BENCH:-1} == 1 ]] || exit 0
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/accuracy_simt.md"
# float32 error against the float64 reference, ours (SIMT) / SDPA's: max abs and norm-wise.
import datetime
import torch
from test_simt import _errors, _inputs, _ours, _reference, _sdpa

print(f"### float32 error ratio SIMT / SDPA ({torch.cuda.get_device_name()}, {datetime.date.today()}): "
      "max abs, norm-wise\n")
print("| B, H, Hk, Nq, Nk, d, causal | out | dq | dk | dv |")
print("|---|---|---|---|---|")
for B, H, Hk, Nq, Nk, d, causal in [(2, 3, 3, 17, 33, 1, False), (1, 2, 2, 300, 300, 100, False),
                                    (1, 1, 1, 257, 130, 128, True), (2, 1, 1, 333, 257, 256, False),
                                    (2, 4, 4, 513, 300, 96, True), (1, 4, 1, 257, 333, 64, True),
                                    (1, 8, 8, 1024, 1024, 64, False)]:
    q, k, v, do = _inputs(B, H, Hk, Nq, Nk, d, torch.float32, seed=d)
    ref, theirs, ours = _reference(q, k, v, do, causal), _sdpa(q, k, v, do, causal), _ours(q, k, v, do, causal, "simt")
    cells = []
    for a, r, t in zip([ours[0], *ours[2:]], [ref[0], *ref[2:]], theirs):
        (om, orel), (tm, trel) = _errors(a, r), _errors(t, r)
        cells.append(f"{om / tm:.2f}, {orel / trel:.2f}")
    print(f"| {B}, {H}, {Hk}, {Nq}, {Nk}, {d}, {causal} | " + " | ".join(cells) + " |")
PY
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/bench_simt.md"
# float32 forward and forward + backward, ms (median, CUDA events, L2 emptied by a read before
# each repeat): SIMT (ours, O(N) memory) against naive (ours, N x N) and SDPA (whichever fused
# kernel PyTorch picks for float32 on this GPU).
import datetime
import torch
import torch.nn.functional as F
import day50_attention as da
from kernel_common.bench import time_us

dev = torch.cuda.get_device_name()
print(f"### float32 attention, ms ({dev}, {datetime.date.today()})\n")
print("| B, H, N, d, causal | SIMT fwd | naive fwd | SDPA fwd | SIMT fwd+bwd | naive fwd+bwd | SDPA fwd+bwd | SIMT TF/s fwd+bwd |")
print("|---|---|---|---|---|---|---|---|")
for B, H, N, d, causal in [(4, 16, 1024, 64, False), (4, 16, 4096, 64, True), (2, 16, 2048, 128, False),
                           (2, 8, 2048, 256, False), (1, 8, 8192, 256, True)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, d, device="cuda", generator=g) for _ in range(4))
    row = []
    for name in ("simt", "naive", "sdpa"):
        if name == "naive" and 3 * B * H * N * N * 4 > 40e9:
            row.append(("-", "-"))
            continue
        if name == "sdpa":
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            fwd = lambda: da.attention_forward(q, k, v, causal, None, name)
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        if name == "sdpa":
            both = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).backward(do)
        else:
            both = lambda: da.attention(qs, ks, vs, causal=causal, backend=name).backward(do)
        with torch.no_grad():
            tf = time_us(fwd, warmup=2, rep=10) / 1e3
        tb = time_us(both, warmup=2, rep=10) / 1e3
        row.append((f"{tf:.2f}", f"{tb:.2f}"))
    flops = 4 * B * H * N * N * d * (0.5 if causal else 1) * 3.5  # forward 1 + backward 2.5
    simt_tf = flops / (float(row[0][1]) * 1e-3) / 1e12
    print(f"| {B}, {H}, {N}, {d}, {causal} | {row[0][0]} | {row[1][0]} | {row[2][0]} | {row[0][1]} | {row[1][1]} | "
          f"{row[2][1]} | {simt_tf:.1f} |")
PY
