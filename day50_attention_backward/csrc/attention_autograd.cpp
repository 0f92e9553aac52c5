// attention_autograd.cpp: attention_forward's autograd, in C++, and the
// extension's C++ entry point (the host fast path).
//
// Why C++: the Python autograd formula (torch.library.register_autograd) costs
// tens of microseconds of host time per forward + backward, and an eager
// training step of a transformer is close to host-bound. A
// torch::autograd::Function at the Autograd key keeps the path in C++;
// torch.compile and opcheck see the same op (AOTAutograd runs this kernel on
// fake tensors, which reach the fakes in day50_attention/ops.py).
//
// Both outputs are differentiable: out, and lse (its gradient reaches the
// backward as grad_lse). Second derivatives are not implemented:
// attention_backward's Autograd key takes torch's "not implemented" fallback, so
// a double backward raises a clear error instead of returning zeros.
//
// Under autocast the nodes are entered from the autocast rule (attention_autocast.cpp)
// with the dtype to compute in: the node casts q, k, v itself and returns their
// gradients in the dtypes they came in (attention_checks.h, GradDtypes).
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "attention_autograd.h"
#include "kc/dispatch.h"

namespace day50 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

using Dtype = std::optional<at::ScalarType>;

Tensor3 call_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, const std::optional<Tensor>& grad_lse, bool causal,
                      std::optional<double> scale, c10::string_view backend, bool deterministic,
                      at::IntArrayRef window, double softcap, Dtype dq, Dtype dk, Dtype dv) {
  static const auto op =
      kc::find_op<Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const std::optional<Tensor>&, bool, std::optional<double>, c10::string_view, bool,
                          at::IntArrayRef, double, Dtype, Dtype, Dtype)>("day50::attention_backward");
  return op.call(grad_out, q, k, v, out, lse, grad_lse, causal, scale, backend, deterministic, window, softcap, dq, dk,
                 dv);
}

using Tensor2 = std::tuple<Tensor, Tensor>;

Tensor2 call_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                            int64_t max_q, int64_t max_k, bool causal, std::optional<double> scale,
                            at::IntArrayRef window, double softcap, bool deterministic) {
  static const auto op =
      kc::find_op<Tensor2(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t,
                          bool, std::optional<double>, at::IntArrayRef, double, bool)>(
          "day50::attention_varlen_forward");
  return op.call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, deterministic);
}

Tensor3 call_varlen_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const std::optional<Tensor>& grad_lse,
                             const Tensor& cu_q, const Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal,
                             std::optional<double> scale, at::IntArrayRef window, double softcap, bool deterministic,
                             Dtype dq, Dtype dk, Dtype dv) {
  static const auto op =
      kc::find_op<Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const std::optional<Tensor>&, const Tensor&, const Tensor&, int64_t, int64_t, bool,
                          std::optional<double>, at::IntArrayRef, double, bool, Dtype, Dtype, Dtype)>(
          "day50::attention_varlen_backward");
  return op.call(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap,
                 deterministic, dq, dk, dv);
}

std::optional<double> saved_scale(AutogradContext* ctx) {
  const auto& sc = ctx->saved_data["scale"];
  return sc.isNone() ? std::nullopt : std::optional<double>(sc.toDouble());
}

// The autocast rule's cast, torch's (floating tensors on the autocast device, float64 excepted),
// done inside the node: its inputs keep their dtypes, so the engine adds no cast of its own to
// the gradients. (Not at::autocast::cached_cast: its cache of leaf casts would hand other ops a
// cast made here, outside autograd.)
Tensor cast_for(const Tensor& t, const std::optional<AutocastTo>& to) {
  if (!to.has_value() || !t.is_floating_point() || t.scalar_type() == at::kDouble || t.device().type() != to->device)
    return t;
  return t.to(to->dtype);
}

// q, k, v cast, saved for the backward with the dtypes their gradients go back in (none: the
// computed dtype).
std::array<Tensor, 3> cast_and_note(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<AutocastTo>& to) {
  std::array<Tensor, 3> c = {cast_for(q, to), cast_for(k, to), cast_for(v, to)};
  const std::array<const Tensor*, 3> in = {&q, &k, &v};
  const char* keys[3] = {"dq_dtype", "dk_dtype", "dv_dtype"};
  for (int i = 0; i < 3; ++i)
    ctx->saved_data[keys[i]] =
        in[i]->scalar_type() == c[i].scalar_type() ? c10::IValue() : c10::IValue(in[i]->scalar_type());
  return c;
}

Dtype saved_dtype(AutogradContext* ctx, const char* key) {
  const auto& t = ctx->saved_data[key];
  return t.isNone() ? std::nullopt : Dtype(t.toScalarType());
}

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                               std::optional<double> scale, std::string backend, bool deterministic,
                               std::vector<int64_t> window, double softcap, std::optional<AutocastTo> to) {
    // An unused output (lse, usually) has no gradient: the backward takes it as absent
    // instead of the engine building and filling a zero tensor on every call.
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    const auto [qt, kt, vt] = cast_and_note(ctx, q, k, v, to);  // the tensors computed with
    auto [out, lse] = call_attention_forward(qt, kt, vt, causal, scale, backend, deterministic, window, softcap);
    ctx->save_for_backward({qt, kt, vt, out, lse});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["backend"] = std::move(backend);
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["window"] = std::move(window);
    ctx->saved_data["softcap"] = softcap;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const Tensor& out = s[3];
    if (!grads[0].defined() && !grads[1].defined()) return variable_list(10);
    const Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(out);
    const std::optional<Tensor> grad_lse = grads[1].defined() ? std::optional<Tensor>(grads[1]) : std::nullopt;
    auto [dq, dk, dv] = call_backward(grad_out, s[0], s[1], s[2], out, s[4], grad_lse,
                                      ctx->saved_data["causal"].toBool(), saved_scale(ctx),
                                      ctx->saved_data["backend"].toStringRef(),
                                      ctx->saved_data["deterministic"].toBool(),
                                      ctx->saved_data["window"].toIntVector(), ctx->saved_data["softcap"].toDouble(),
                                      saved_dtype(ctx, "dq_dtype"), saved_dtype(ctx, "dk_dtype"),
                                      saved_dtype(ctx, "dv_dtype"));
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// attention_varlen_forward's autograd: the same shape as AttentionFunction (the offsets and
// lengths are saved as they are; no gradient flows to them).
class AttentionVarlenFunction : public torch::autograd::Function<AttentionVarlenFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_q, const Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal,
                               std::optional<double> scale, std::vector<int64_t> window, double softcap,
                               bool deterministic, std::optional<AutocastTo> to) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    const auto [qt, kt, vt] = cast_and_note(ctx, q, k, v, to);  // the tensors computed with
    auto [out, lse] = call_varlen_forward(qt, kt, vt, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap,
                                          deterministic);
    ctx->save_for_backward({qt, kt, vt, out, lse, cu_q, cu_k});
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["window"] = std::move(window);
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["deterministic"] = deterministic;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const Tensor& out = s[3];
    if (!grads[0].defined() && !grads[1].defined()) return variable_list(13);
    const Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(out);
    const std::optional<Tensor> grad_lse = grads[1].defined() ? std::optional<Tensor>(grads[1]) : std::nullopt;
    auto [dq, dk, dv] = call_varlen_backward(
        grad_out, s[0], s[1], s[2], out, s[4], grad_lse, s[5], s[6], ctx->saved_data["max_q"].toInt(),
        ctx->saved_data["max_k"].toInt(), ctx->saved_data["causal"].toBool(), saved_scale(ctx),
        ctx->saved_data["window"].toIntVector(), ctx->saved_data["softcap"].toDouble(),
        ctx->saved_data["deterministic"].toBool(), saved_dtype(ctx, "dq_dtype"), saved_dtype(ctx, "dk_dtype"),
        saved_dtype(ctx, "dv_dtype"));
    variable_list r(13);
    r[0] = dq;
    r[1] = dk;
    r[2] = dv;
    return r;
  }
};

std::tuple<Tensor, Tensor> attention_forward_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                      std::optional<double> scale, c10::string_view backend,
                                                      bool deterministic, at::IntArrayRef window,
                                                      double softcap) {
  auto r = AttentionFunction::apply(q, k, v, causal, scale, std::string(backend), deterministic, window.vec(),
                                    softcap, std::optional<AutocastTo>());
  return {r[0], r[1]};
}

Tensor2 attention_varlen_forward_autograd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                                          const Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal,
                                          std::optional<double> scale, at::IntArrayRef window, double softcap,
                                          bool deterministic) {
  auto r = AttentionVarlenFunction::apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window.vec(), softcap,
                                          deterministic, std::optional<AutocastTo>());
  return {r[0], r[1]};
}

}  // namespace

std::tuple<Tensor, Tensor> attention_forward_autocast(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                      std::optional<double> scale, c10::string_view backend,
                                                      bool deterministic, at::IntArrayRef window, double softcap,
                                                      AutocastTo to) {
  auto r = AttentionFunction::apply(q, k, v, causal, scale, std::string(backend), deterministic, window.vec(),
                                    softcap, std::optional<AutocastTo>(to));
  return {r[0], r[1]};
}

Tensor2 attention_varlen_forward_autocast(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                                          const Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal,
                                          std::optional<double> scale, at::IntArrayRef window, double softcap,
                                          bool deterministic, AutocastTo to) {
  auto r = AttentionVarlenFunction::apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window.vec(), softcap,
                                          deterministic, std::optional<AutocastTo>(to));
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor> call_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  std::optional<double> scale, c10::string_view backend,
                                                  bool deterministic, at::IntArrayRef window, double softcap) {
  static const auto op =
      kc::find_op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                             std::optional<double>, c10::string_view, bool, at::IntArrayRef,
                                             double)>("day50::attention_forward");
  return op.call(q, k, v, causal, scale, backend, deterministic, window, softcap);
}

}  // namespace day50

TORCH_LIBRARY_IMPL(day50, Autograd, m) {
  m.impl("attention_forward", &day50::attention_forward_autograd);
  m.impl("attention_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("attention_varlen_forward", &day50::attention_varlen_forward_autograd);
  m.impl("attention_varlen_backward", torch::autograd::autogradNotImplementedFallback());
}
