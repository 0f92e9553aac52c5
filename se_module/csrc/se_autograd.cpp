// se_autograd.cpp: the fused block's autograd, in C++.
//
// The stage ops get their autograd from torch.library.register_autograd
// (se_module/ops.py). The fused block does not: measured on an H200
// (README, version log), a Python autograd formula costs ~100 us of host time
// per forward + backward (the Python autograd.Function, the re-entry into the
// dispatcher, setup_context), which is more than the GPU work of the whole
// block up to ~16 x 64 x 112 x 112 fp32. A C++ torch::autograd::Function at the
// Autograd key (as torchvision does for its ops) keeps the host path short.
// torch.compile and opcheck work the same: AOTAutograd runs this kernel on fake
// tensors, which calls se_block / se_block_backward's fakes (ops.py).
#include <optional>
#include <tuple>

#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "se_dispatch.h"
#include "se_plan.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Tensor5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Tensor5 call_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                      const at::Tensor& w2, const at::Tensor& b2, int64_t act, int64_t version, int64_t gate,
                      const std::optional<at::Tensor>& state) {
  static const auto op =
      kc::find_op<Tensor5(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
                          const std::optional<at::Tensor>&)>("se_module::se_block_backward");
  return op.call(g, x, w1, b1, w2, b2, act, version, gate, state);
}

class SEBlockFunction : public torch::autograd::Function<SEBlockFunction> {
 public:
  // keep: the forward of a step that will run the backward, at a version whose plan may
  // keep the saved state (se_plan.h): se_block_train, and the state saved with x and the
  // weights; the backward's plan says whether it reads it.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                            const at::Tensor& w2, const at::Tensor& b2, int64_t act, int64_t version,
                            int64_t gate, bool keep) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out, state;
    if (keep) {
      std::tie(out, state) = se_glue::call_se_block_train(x, w1, b1, w2, b2, act, version, gate);
      ctx->save_for_backward({x, w1, b1, w2, b2, state});
    } else {
      out = se_glue::call_se_block(x, w1, b1, w2, b2, act, version, gate);
      ctx->save_for_backward({x, w1, b1, w2, b2});
    }
    ctx->saved_data["act"] = act;
    ctx->saved_data["version"] = version;
    ctx->saved_data["gate"] = gate;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const std::optional<at::Tensor> state = s.size() > 5 ? std::optional<at::Tensor>(s[5]) : std::nullopt;
    auto [dx, dw1, db1, dw2, db2] = call_backward(grads[0], s[0], s[1], s[2], s[3], s[4],
                                                  ctx->saved_data["act"].toInt(),
                                                  ctx->saved_data["version"].toInt(),
                                                  ctx->saved_data["gate"].toInt(), state);
    return {dx, dw1, db1, dw2, db2, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor se_block_autograd(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                             const at::Tensor& b2, int64_t act, int64_t version, int64_t gate) {
  const bool keep = se::may_keep_state(version) && at::GradMode::is_enabled() &&
                    (x.requires_grad() || w1.requires_grad() || b1.requires_grad() || w2.requires_grad() ||
                     b2.requires_grad());
  return SEBlockFunction::apply(x, w1, b1, w2, b2, act, version, gate, keep);
}

}  // namespace

// Second derivatives are not implemented: se_block_backward's Autograd key takes
// torch's "not implemented" fallback, so a double backward raises a clear error.
TORCH_LIBRARY_IMPL(se_module, Autograd, m) {
  m.impl("se_block", &se_block_autograd);
  m.impl("se_block_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("se_block_train", torch::autograd::autogradNotImplementedFallback());
}
