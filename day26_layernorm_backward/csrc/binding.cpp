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
#include <array>
#include <tuple>
#include <vector>

#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>
#include <torch/python.h>

#include "kc/dispatch.h"
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

// layer_norm_fwd's autograd, in C++, and the extension's C++ entry points (the host
// fast path).
//
// Why C++: a Python autograd formula (torch.library.register_autograd) costs tens
// of microseconds of host time per forward + backward (the Python
// autograd.Function, setup_context, the re-entry into the dispatcher), and an
// eager training step of a model like GPT-2 is close to host-bound, so host time
// is step time. A torch::autograd::Function at the Autograd key keeps the whole
// path in C++. torch.compile and opcheck see the same op: AOTAutograd runs this
// kernel on fake tensors, which reach the fakes in day26_layernorm/ops.py.
//
// Second derivatives are not implemented: layer_norm_bwd's Autograd key takes
// torch's "not implemented" fallback, so a double backward raises a clear error
// instead of returning zeros.
namespace day26 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

Tensor3 call_backward(const Tensor& dy, const Tensor& x, at::IntArrayRef nshape, const Tensor& mean,
                      const Tensor& rstd, const OptTensor& weight, std::array<bool, 3> mask, int64_t version) {
  static const auto op =
      kc::find_op<Tensor3(const Tensor&, const Tensor&, at::IntArrayRef, const Tensor&, const Tensor&,
                          const OptTensor&, std::array<bool, 3>, int64_t)>("day26::layer_norm_bwd");
  return op.call(dy, x, nshape, mean, rstd, weight, mask, version);
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

bool present(const OptTensor& t) { return t.has_value() && t->defined(); }

// The node's inputs are the tensors among forward's arguments: x, then weight and
// bias where given (an absent optional is no input), so needs_input_grad's index
// of bias depends on whether there is a weight.
class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, std::vector<int64_t> nshape,
                               const OptTensor& weight, const OptTensor& bias, double eps, int64_t version) {
    // mean and rstd take no gradient: without this the engine would build (and fill) zero
    // tensors for their undefined gradients on every backward, host time for nothing.
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = call_layer_norm_fwd(x, nshape, weight, bias, eps, version);
    ctx->save_for_backward({x, present(weight) ? *weight : Tensor(), mean, rstd});
    ctx->saved_data["nshape"] = std::move(nshape);
    ctx->saved_data["version"] = version;
    ctx->saved_data["bias_dtype"] = present(bias) ? int64_t(bias->scalar_type()) : int64_t(-1);
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& weight = saved[1];
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    const bool has_w = weight.defined(), has_b = bias_dtype >= 0;
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), has_w && ctx->needs_input_grad(1),
                                      has_b && ctx->needs_input_grad(has_w ? 2 : 1)};
    variable_list out(6);
    // mean and rstd are statistics for the backward, not differentiable outputs:
    // only y's gradient (grads[0]) flows.
    if (!grads[0].defined() || !(mask[0] || mask[1] || mask[2])) return out;
    const auto nshape = ctx->saved_data["nshape"].toIntVector();
    auto [dx, dw, db] = call_backward(grads[0], x, nshape, saved[2], saved[3], opt(weight), mask,
                                      ctx->saved_data["version"].toInt());
    if (mask[0]) out[0] = dx;
    if (mask[1]) out[2] = dw;
    if (mask[2]) {
      const auto bdt = static_cast<at::ScalarType>(bias_dtype);
      out[3] = db.scalar_type() == bdt ? db : db.to(bdt);
    }
    return out;
  }
};

Tensor3 layer_norm_fwd_autograd(const Tensor& x, at::IntArrayRef nshape, const OptTensor& weight,
                                const OptTensor& bias, double eps, int64_t version) {
  auto r = LayerNormFunction::apply(x, nshape.vec(), weight, bias, eps, version);
  return {r[0], r[1], r[2]};
}

using Tensor2 = std::tuple<Tensor, Tensor>;

// rms_norm_fwd's autograd: as LayerNormFunction, with rstd the only statistic.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, std::vector<int64_t> nshape,
                               const OptTensor& weight, double eps, int64_t version) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = call_rms_norm_fwd(x, nshape, weight, eps, version);
    ctx->save_for_backward({x, present(weight) ? *weight : Tensor(), rstd});
    ctx->saved_data["nshape"] = std::move(nshape);
    ctx->saved_data["version"] = version;
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& weight = saved[1];
    const std::array<bool, 2> mask = {ctx->needs_input_grad(0), weight.defined() && ctx->needs_input_grad(1)};
    variable_list out(5);
    if (!grads[0].defined() || !(mask[0] || mask[1])) return out;
    static const auto op = kc::find_op<Tensor2(const Tensor&, const Tensor&, at::IntArrayRef, const Tensor&,
                                               const OptTensor&, std::array<bool, 2>, int64_t)>(
        "day26::rms_norm_bwd");
    const auto nshape = ctx->saved_data["nshape"].toIntVector();
    auto [dx, dw] = op.call(grads[0], x, nshape, saved[2], opt(weight), mask, ctx->saved_data["version"].toInt());
    if (mask[0]) out[0] = dx;
    if (mask[1]) out[2] = dw;
    return out;
  }
};

Tensor2 rms_norm_fwd_autograd(const Tensor& x, at::IntArrayRef nshape, const OptTensor& weight, double eps,
                              int64_t version) {
  auto r = RmsNormFunction::apply(x, nshape.vec(), weight, eps, version);
  return {r[0], r[1]};
}

using Tensor4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// add_norm_fwd's autograd: y = norm(s), s = x + residual. Both outputs take
// gradients (either may be undefined): ds_total = dsum + the norm's dx, the
// gradient of x and of the residual alike (one tensor returned for both). The
// node's inputs: x, residual, then weight and bias where given.
class AddNormFunction : public torch::autograd::Function<AddNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& residual,
                               std::vector<int64_t> nshape, const OptTensor& weight, const OptTensor& bias,
                               double eps, bool rms, int64_t version) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, s, mean, rstd] = call_add_norm_fwd(x, residual, nshape, weight, bias, eps, rms, version);
    ctx->save_for_backward({s, present(weight) ? *weight : Tensor(), mean, rstd});
    ctx->saved_data["nshape"] = std::move(nshape);
    ctx->saved_data["version"] = version;
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["bias_dtype"] = present(bias) ? int64_t(bias->scalar_type()) : int64_t(-1);
    ctx->mark_non_differentiable({mean, rstd});
    return {y, s, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& s = saved[0];
    const Tensor& weight = saved[1];
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    const bool has_w = weight.defined(), has_b = bias_dtype >= 0;
    const bool want_x = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    const std::array<bool, 3> mask = {want_x, has_w && ctx->needs_input_grad(2),
                                      has_b && ctx->needs_input_grad(has_w ? 3 : 2)};
    variable_list out(8);
    const Tensor& dy = grads[0];
    const Tensor& dsum = grads[1];
    Tensor dx;
    if (!dy.defined()) {  // only the sum was used: the norm contributes nothing
      dx = dsum;
    } else if (mask[0] || mask[1] || mask[2]) {
      static const auto op = kc::find_op<Tensor3(const Tensor&, const OptTensor&, const Tensor&, at::IntArrayRef,
                                                 const Tensor&, const Tensor&, const OptTensor&, bool,
                                                 std::array<bool, 3>, int64_t)>("day26::add_norm_bwd");
      const auto nshape = ctx->saved_data["nshape"].toIntVector();
      auto [dxs, dw, db] = op.call(dy, opt(dsum), s, nshape, saved[2], saved[3], opt(weight),
                                   ctx->saved_data["rms"].toBool(), mask, ctx->saved_data["version"].toInt());
      dx = dxs;
      if (mask[1]) out[3] = dw;
      if (mask[2]) {
        const auto bdt = static_cast<at::ScalarType>(bias_dtype);
        out[4] = db.scalar_type() == bdt ? db : db.to(bdt);
      }
    }
    if (ctx->needs_input_grad(0)) out[0] = dx;
    if (ctx->needs_input_grad(1)) out[1] = dx;
    return out;
  }
};

Tensor4 add_norm_fwd_autograd(const Tensor& x, const Tensor& residual, at::IntArrayRef nshape,
                              const OptTensor& weight, const OptTensor& bias, double eps, bool rms,
                              int64_t version) {
  auto r = AddNormFunction::apply(x, residual, nshape.vec(), weight, bias, eps, rms, version);
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace

Tensor4 call_add_norm_fwd(const Tensor& x, const Tensor& residual, at::IntArrayRef nshape, const OptTensor& weight,
                          const OptTensor& bias, double eps, bool rms, int64_t version) {
  static const auto op = kc::find_op<Tensor4(const Tensor&, const Tensor&, at::IntArrayRef, const OptTensor&,
                                             const OptTensor&, double, bool, int64_t)>("day26::add_norm_fwd");
  return op.call(x, residual, nshape, weight, bias, eps, rms, version);
}

Tensor3 call_layer_norm_fwd(const Tensor& x, at::IntArrayRef nshape, const OptTensor& weight,
                            const OptTensor& bias, double eps, int64_t version) {
  static const auto op = kc::find_op<Tensor3(const Tensor&, at::IntArrayRef, const OptTensor&, const OptTensor&,
                                             double, int64_t)>("day26::layer_norm_fwd");
  return op.call(x, nshape, weight, bias, eps, version);
}

std::tuple<Tensor, Tensor> call_rms_norm_fwd(const Tensor& x, at::IntArrayRef nshape, const OptTensor& weight,
                                             double eps, int64_t version) {
  static const auto op = kc::find_op<std::tuple<Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&,
                                                                double, int64_t)>("day26::rms_norm_fwd");
  return op.call(x, nshape, weight, eps, version);
}

}  // namespace day26

TORCH_LIBRARY_IMPL(day26, Autograd, m) {
  m.impl("layer_norm_fwd", &day26::layer_norm_fwd_autograd);
  m.impl("layer_norm_bwd", torch::autograd::autogradNotImplementedFallback());
  m.impl("rms_norm_fwd", &day26::rms_norm_fwd_autograd);
  m.impl("rms_norm_bwd", torch::autograd::autogradNotImplementedFallback());
  m.impl("add_norm_fwd", &day26::add_norm_fwd_autograd);
  m.impl("add_norm_bwd", torch::autograd::autogradNotImplementedFallback());
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
LnFwdPlanQuery& ln_forward_plan_query() {
  static LnFwdPlanQuery query = nullptr;
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
  // Private (tests, tools/): day26_layernorm.ops.forward_plan() is the way to use it.
  m.def("_forward_plan", [](const at::Tensor& x, std::vector<int64_t> nshape, std::optional<at::Tensor> weight,
                            std::optional<at::Tensor> bias, int64_t version, std::optional<at::Tensor> residual,
                            bool rms) {
    TORCH_CHECK(day26::ln_forward_plan_query() != nullptr, "day26: the forward plan needs a CUDA build");
    TORCH_CHECK(x.is_cuda(), "day26: the forward plan is for CUDA tensors");
    const auto pairs = day26::ln_forward_plan_query()(x, nshape, weight, bias, version, residual, rms);
    pybind11::dict d;
    for (const auto& [k, v] : pairs) d[pybind11::str(k)] = v;
    return d;
  });
}
