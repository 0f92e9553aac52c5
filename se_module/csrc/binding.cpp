// Schemas of the se_module ops, the fused block's autograd and the Python module.
// Implementations: se_cpu.cpp (CPU) and se_cuda.cpp (CUDA); the stages' autograd and
// fake tensors: se_module/ops.py. One translation unit: the autograd and the module
// parse the same torch headers, which are most of this day's CPU build time.
#include <optional>
#include <tuple>

#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>
#include <torch/python.h>

#include "kc/torch_utils.h"

#include "se_dispatch.h"
#include "se_plan.h"

TORCH_LIBRARY(se_module, m) {
  // the seed's stages
  m.def("global_avg_pool(Tensor x, int version=2) -> Tensor");
  m.def("global_avg_pool_backward(Tensor grad, SymInt H, SymInt W, bool channels_last) -> Tensor");
  m.def("swish(Tensor x) -> Tensor");
  m.def("swish_backward(Tensor grad, Tensor x) -> Tensor");
  m.def("sigmoid(Tensor x) -> Tensor");
  m.def("sigmoid_backward(Tensor grad, Tensor y) -> Tensor");
  m.def("excitation(Tensor x, Tensor s) -> Tensor");
  m.def("excitation_backward(Tensor grad, Tensor x, Tensor s) -> (Tensor, Tensor)");
  // the fused block; activation (after fc1): 0 = ReLU, 1 = SiLU, 2 = Hardswish;
  // scale_activation (the gate, after fc2): 0 = Sigmoid, 1 = Hardsigmoid.
  // The default version is written here once; ops.DEFAULT_VERSION reads it from the schema.
#define SE_DEFAULT_VERSION "0"
  m.def("se_block(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int activation, "
        "int version=" SE_DEFAULT_VERSION ", int scale_activation=0) -> Tensor");
  // se_block_train: the forward of a training step, which also returns the values that
  // the spread MLP's backward reads (state, fp32 [N, 3 C + 2 S]; se_module.h, "The saved
  // state"); se_block_backward takes it back (the same x, weights and codes) or recomputes.
  m.def("se_block_train(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int activation, "
        "int version=" SE_DEFAULT_VERSION ", int scale_activation=0) -> (Tensor, Tensor)");
  m.def("se_block_backward(Tensor grad, Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int activation, "
        "int version=" SE_DEFAULT_VERSION ", int scale_activation=0, Tensor? state=None) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
#undef SE_DEFAULT_VERSION
}

// The fused block's autograd, in C++.
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

// se_module_C.se_block: torch.ops.se_module.se_block through the C++ dispatcher
// (se_dispatch.h), without the Python op-call path (schema matching of Python
// arguments, boxing): several us of host time per call, measured on the H200
// machine (README). Used by ops.se_block and SqueezeExcitation.forward only for
// plain tensors with no __torch_function__ override or mode and outside
// torch.compile; everything else takes torch.ops.se_module.se_block.

namespace {

// _plan's stand-in for the cluster occupancy query: every cluster fits at once.
int all_fit(kc::DType, kc::DType, se::Layout, bool, int, int, size_t) { return 1 << 20; }

// The plan of a fused call for a described device, as a dict (tests: the plan table
// checked on any machine). Tensors at 16-byte-aligned addresses, as fresh ones are.
py::dict plan_for(int64_t n, int64_t c, int64_t h, int64_t w, int64_t s, int64_t dtype, bool channels_last,
                  int64_t version, bool backward, bool state, int sms, int cc_major, int smem_optin,
                  bool clusters_fit) {
  se::PlanInputs in;
  in.d = se::Dims{n, c, h * w, channels_last ? se::Layout::NHWC : se::Layout::NCHW};
  in.S = s;
  in.dt = in.wdt = kc::DType(dtype);
  in.version = version;
  in.dev = se::DeviceInfo{sms, cc_major, smem_optin};
  const void* at = reinterpret_cast<const void*>(uintptr_t(256));
  in.x = in.g = in.out = in.w1 = in.b1 = in.w2 = in.b2 = at;
  in.state = state;
  in.capacity = clusters_fit ? &all_fit : nullptr;
  const se::SePlan p = backward ? se::plan_backward(in) : se::plan_forward(in);
  static const char* paths[] = {"block", "spread", "cluster"};
  py::dict r;
  r["path"] = paths[int(p.path)];
  r["pdl"] = p.launch.pdl;
  r["splits"] = p.reduce.splits;
  r["staged"] = p.staged;
  r["keep_state"] = p.keep_state;
  r["use_state"] = p.use_state;
  r["coef_direct"] = p.coef_direct;
  r["da_direct"] = p.da_direct;
  r["widen"] = p.cast.widen;
  r["transpose_w1"] = p.cast.transpose_w1;
  r["transpose_w2"] = p.cast.transpose_w2;
  r["cast_blocks"] = p.cast.blocks;
  r["wgrad_beside"] = p.wgrad_beside;
  r["workspace"] = p.workspace;
  r["cluster_k"] = p.cluster.k;
  r["cluster_threads"] = p.cluster.threads;
  return r;
}

}  // namespace

// Importing the module runs the registrations above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "se_module ops (torch.ops.se_module)";
  kc::bind_test_hooks(m);
  m.def("se_block", &se_glue::call_se_block, "torch.ops.se_module.se_block called from C++ (host fast path)");
  m.def("_plan_count", &se::plan_count, "private (tests): fused-call plans computed by this process");
  m.def("_plan", &plan_for, "private (tests): the plan of a fused call on a described device",
        py::arg("n"), py::arg("c"), py::arg("h"), py::arg("w"), py::arg("s"), py::arg("dtype"),
        py::arg("channels_last"), py::arg("version"), py::arg("backward"), py::arg("state"), py::arg("sms"),
        py::arg("cc_major"), py::arg("smem_optin"), py::arg("clusters_fit"));
}
