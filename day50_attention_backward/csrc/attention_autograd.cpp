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
#include <optional>
#include <string>
#include <tuple>

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

Tensor3 call_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, const std::optional<Tensor>& grad_lse, bool causal,
                      std::optional<double> scale, c10::string_view backend, bool deterministic) {
  static const auto op =
      kc::find_op<Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const std::optional<Tensor>&, bool, std::optional<double>, c10::string_view, bool)>(
          "day50::attention_backward");
  return op.call(grad_out, q, k, v, out, lse, grad_lse, causal, scale, backend, deterministic);
}

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                               std::optional<double> scale, std::string backend, bool deterministic) {
    // An unused output (lse, usually) has no gradient: the backward takes it as absent
    // instead of the engine building and filling a zero tensor on every call.
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = call_attention_forward(q, k, v, causal, scale, backend, deterministic);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["backend"] = std::move(backend);
    ctx->saved_data["deterministic"] = deterministic;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const Tensor& out = s[3];
    if (!grads[0].defined() && !grads[1].defined()) return variable_list(7);
    const Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(out);
    const std::optional<Tensor> grad_lse = grads[1].defined() ? std::optional<Tensor>(grads[1]) : std::nullopt;
    const auto& sc = ctx->saved_data["scale"];
    auto [dq, dk, dv] = call_backward(grad_out, s[0], s[1], s[2], out, s[4], grad_lse,
                                      ctx->saved_data["causal"].toBool(),
                                      sc.isNone() ? std::nullopt : std::optional<double>(sc.toDouble()),
                                      ctx->saved_data["backend"].toStringRef(),
                                      ctx->saved_data["deterministic"].toBool());
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> attention_forward_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                      std::optional<double> scale, c10::string_view backend,
                                                      bool deterministic) {
  auto r = AttentionFunction::apply(q, k, v, causal, scale, std::string(backend), deterministic);
  return {r[0], r[1]};
}

}  // namespace

std::tuple<Tensor, Tensor> call_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  std::optional<double> scale, c10::string_view backend,
                                                  bool deterministic) {
  static const auto op =
      kc::find_op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                             std::optional<double>, c10::string_view, bool)>("day50::attention_forward");
  return op.call(q, k, v, causal, scale, backend, deterministic);
}

}  // namespace day50

TORCH_LIBRARY_IMPL(day50, Autograd, m) {
  m.impl("attention_forward", &day50::attention_forward_autograd);
  m.impl("attention_backward", torch::autograd::autogradNotImplementedFallback());
}
