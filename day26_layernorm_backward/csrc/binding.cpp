// Op schemas of day26 (implementations: layernorm_cpu.cpp, layernorm_cuda.cpp).
//
// layer_norm_fwd(x, normalized_shape, weight?, bias?, eps, version) -> (y, mean, rstd)
//   mean and rstd: fp32 (fp64 for fp64 input on CPU), shape = x's leading dims.
// layer_norm_bwd(dy, x, normalized_shape, mean, rstd, weight?, output_mask, version)
//   -> (dx, dweight, dbias); an output whose mask entry is false (or dweight
//   without a weight) is returned as an empty tensor of shape [0].
// version (CUDA; the CPU checks its range and ignores it): 0 = auto (the
// default, written here once: the plan's table per shape), 1 = the seed's
// algorithm, 2 = row in registers, 3 = 2 on a cp.async pipeline, 4 = row
// slots, 5 = 4 on a copy-engine ring (backward), 6 = rows split across a
// thread-block cluster (layernorm_versions.h: the fallbacks; the README).
#include <torch/library.h>
#include <torch/python.h>

#include "kc/torch_utils.h"
#include "layernorm_knobs.h"
#include "layernorm_autograd.h"

TORCH_LIBRARY(day26, m) {
  m.def("layer_norm_fwd(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, int version=0)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_bwd(Tensor dy, Tensor x, int[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight,"
        " bool[3] output_mask, int version=0) -> (Tensor, Tensor, Tensor)");
  // RMSNorm on the same kernels and plan: no mean, no bias. rstd as layer_norm_fwd's.
  m.def("rms_norm_fwd(Tensor x, int[] normalized_shape, Tensor? weight, float eps, int version=0)"
        " -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, int[] normalized_shape, Tensor rstd, Tensor? weight,"
        " bool[2] output_mask, int version=0) -> (Tensor, Tensor)");
  // add_norm: (norm(x + residual), x + residual, mean, rstd) in one pass; rms: RMSNorm
  // (no bias; mean an empty [0] tensor). The backward takes the saved sum and the
  // gradients of both outputs (dsum may be None) and returns dx = the norm's dx +
  // dsum, the gradient of x and of the residual alike.
  m.def("add_norm_fwd(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps,"
        " bool rms, int version=0) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("add_norm_bwd(Tensor dy, Tensor? dsum, Tensor sum, int[] normalized_shape, Tensor mean, Tensor rstd,"
        " Tensor? weight, bool rms, bool[3] output_mask, int version=0) -> (Tensor, Tensor, Tensor)");
}

// Importing the module runs the registrations above. layer_norm_fwd here is
// torch.ops.day26.layer_norm_fwd called from C++ (the host fast path that
// kernel_common.fastpath.entry takes for plain tensors; same op, same autograd).
namespace day26 {
// The tuning-knob table (layernorm.h): every entry -1 (the library's choices)
// until a test or tool sets one through _set_knob.
int* ln_knobs() {
  static int table[kNumKnobs] = {-1, -1, -1, -1, -1};
  static_assert(kNumKnobs == 5, "one initialiser per knob");
  return table;
}
LnBwdPlanQuery& ln_backward_plan_query() {
  static LnBwdPlanQuery query = nullptr;
  return query;
}
}  // namespace day26

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "day26: LayerNorm forward and backward (torch.ops.day26)";
  kc::bind_test_hooks(m);
  m.def("layer_norm_fwd", [](const at::Tensor& x, std::vector<int64_t> nshape, std::optional<at::Tensor> weight,
                             std::optional<at::Tensor> bias, double eps, int64_t version) {
    return day26::call_layer_norm_fwd(x, nshape, weight, bias, eps, version);
  });
  m.def("rms_norm_fwd", [](const at::Tensor& x, std::vector<int64_t> nshape, std::optional<at::Tensor> weight,
                           double eps, int64_t version) {
    return day26::call_rms_norm_fwd(x, nshape, weight, eps, version);
  });
  m.def("add_norm_fwd", [](const at::Tensor& x, const at::Tensor& residual, std::vector<int64_t> nshape,
                           std::optional<at::Tensor> weight, std::optional<at::Tensor> bias, double eps, bool rms,
                           int64_t version) {
    return day26::call_add_norm_fwd(x, residual, nshape, weight, bias, eps, rms, version);
  });
  // Private (tests, tools/): day26_layernorm.ops.knobs() is the way to use these.
  m.def("_set_knob", [](int knob, int value) {
    TORCH_CHECK(knob >= 0 && knob < day26::kNumKnobs, "day26: no knob ", kc::fmt(knob));
    day26::ln_knobs()[knob] = value;
  });
  m.def("_knob_names", [] {
    return std::vector<std::string>{"target_iters", "l2_prefetch", "grid", "ring_stages", "cluster"};
  });
  // Private (tests, tools/): day26_layernorm.ops.backward_plan() is the way to use it.
  m.def("_backward_plan", [](const at::Tensor& dy, const at::Tensor& x, std::vector<int64_t> nshape,
                             const at::Tensor& mean, const at::Tensor& rstd, std::optional<at::Tensor> weight,
                             std::array<bool, 3> mask, int64_t version, std::optional<at::Tensor> dsum, bool rms) {
    TORCH_CHECK(day26::ln_backward_plan_query() != nullptr, "day26: the backward plan needs a CUDA build");
    TORCH_CHECK(x.is_cuda(), "day26: the backward plan is for CUDA tensors");
    const auto pairs = day26::ln_backward_plan_query()(dy, x, nshape, mean, rstd, weight, mask, version, dsum, rms);
    pybind11::dict d;
    for (const auto& [k, v] : pairs) d[pybind11::str(k)] = v;
    return d;
  });
}
