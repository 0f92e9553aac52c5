// Schemas of the se_module ops. Implementations: se_cpu.cpp (CPU) and
// se_cuda.cpp (CUDA); autograd and fake tensors: se_module/ops.py.
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
