// Schemas of the day-50 ops. Importing the extension module runs these
// registrations; the implementations live in attention_cpu.cpp (CPU) and
// attention_cuda.cpp (CUDA).
#include <torch/library.h>
#include <torch/python.h>

#include "kc/torch_utils.h"

#include <utility>
#include <vector>

#include "attention_autograd.h"
#include "attention_knobs.h"

TORCH_LIBRARY(day50, m) {
  // Returns (out, lse): out (B, H, Nq, d) like F.scaled_dot_product_attention,
  // lse (B, H, Nq) = logsumexp over keys of scale * q.k (float32; float64 for
  // float64 inputs). scale=None means 1/sqrt(d). backend: auto | fused | naive.
  // deterministic: the backward's dq (and dk, dv) bitwise the same from run to run; the
  // forward only carries it to its autograd (see attention_backward).
  // window (left, right): query i sees keys i - left .. i + right (-1: unbounded; flash-attn's
  // window_size, aligned top-left as causal is; causal=True is right = 0); softcap > 0: each
  // score s becomes softcap * tanh(s / softcap). attention_math.h has the rules.
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
        "str backend=\"auto\", bool deterministic=False, int[2] window=[-1, -1], float softcap=0.0) "
        "-> (Tensor, Tensor)");
  // Returns (dq, dk, dv). grad_lse (optional) is the gradient flowing into lse.
  // deterministic=True: a fixed order for every sum (the fused path's dq adds are ordered
  // key block by key block, hopper_bwd.cu; where that kernel does not run, "auto" takes the
  // naive path, which has no atomics, and "fused" is an error). dq_dtype, dk_dtype, dv_dtype:
  // the gradients' dtypes (default q's, k's, v's); the autograd node of a call under autocast
  // asks for the dtypes of the tensors it cast, so float32 q and k get float32 gradients from
  // the fused kernels' fp32 sums without a cast kernel (attention_checks.h, GradDtypes).
  m.def("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor? grad_lse, bool causal=False, float? scale=None, str backend=\"auto\", bool deterministic=False, "
        "int[2] window=[-1, -1], float softcap=0.0, *, ScalarType? dq_dtype=None, ScalarType? dk_dtype=None, "
        "ScalarType? dv_dtype=None) -> (Tensor, Tensor, Tensor)");
  // Packed sequences (flash-attn's varlen): q (total_q, H, d), k, v (total_k, Hk, d), B sequences
  // at the int32 offsets cu_seqlens_q / _k (B + 1 each, from 0); max_seqlen_* bound every
  // length. Causal and the window align bottom-right within each sequence. Returns (out
  // (total_q, H, d), lse (H, total_q)). CUDA, fp16 / bf16: fused, no host sync (CUDA-graph
  // capturable); other dtypes or deterministic=True read the offsets on the host.
  m.def("attention_varlen_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, bool causal=False, float? scale=None, int[2] window=[-1, -1], "
        "float softcap=0.0, bool deterministic=False) -> (Tensor, Tensor)");
  m.def("attention_varlen_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor? grad_lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
        "bool causal=False, float? scale=None, int[2] window=[-1, -1], float softcap=0.0, "
        "bool deterministic=False, *, ScalarType? dq_dtype=None, ScalarType? dk_dtype=None, "
        "ScalarType? dv_dtype=None) -> (Tensor, Tensor, Tensor)");
  // The naive path's tiled matmul, exposed for testing: a (Bt, M, K) (or (Bt, K, M)
  // with trans_a), b (Bt, K, N) (or (Bt, N, K) with trans_b) -> alpha * op(a) @ op(b).
  m.def("matmul(Tensor a, Tensor b, bool trans_a=False, bool trans_b=False, float alpha=1.0) -> Tensor");
}

// Importing the module runs the registrations above. attention_forward here is
// torch.ops.day50.attention_forward called from C++ (the host fast path that
// kernel_common.fastpath.entry takes for plain tensors; same op, same autograd).
namespace day50 {
int& fused_fwd_version() {
  static int version = 0;
  return version;
}
int& fused_bwd_version() {
  static int version = 0;
  return version;
}
}  // namespace day50

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "day50 attention ops (registered as torch.ops.day50.*)";
  kc::bind_test_hooks(m);
  m.def("attention_forward", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                std::optional<double> scale, const std::string& backend, bool deterministic,
                                const std::vector<int64_t>& window, double softcap) {
    return day50::call_attention_forward(q, k, v, causal, scale, backend, deterministic, window, softcap);
  });
  // Private: day50_attention.kernel_versions() (ops.py), a scoped context, is the way to use
  // these. Each returns the version it replaces, so the context restores it on exit.
  m.def("_set_fwd_version", [](int v) {
    TORCH_CHECK(v >= 0 && v <= 2, "day50: fused forward version must be 0 (auto), 1 (mma.sync) or 2 (Hopper)");
    return std::exchange(day50::fused_fwd_version(), v);
  });
  m.def("_set_bwd_version", [](int v) {
    TORCH_CHECK(v >= 0 && v <= 2, "day50: fused backward version must be 0 (auto), 1 (mma.sync) or 2 (Hopper)");
    return std::exchange(day50::fused_bwd_version(), v);
  });
}
