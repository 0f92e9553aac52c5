// Schemas of the se_module ops. Implementations: se_cpu.cpp (CPU) and
// se_cuda.cpp (CUDA); autograd and fake tensors: se_module/ops.py.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/python.h>

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
  // the fused block; activation: 0 = ReLU, 1 = SiLU
  m.def("se_block(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int activation, int version=3) -> Tensor");
  m.def("se_block_backward(Tensor grad, Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int activation, "
        "int version=3) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

namespace {

// torch.ops.se_module.se_block through the C++ dispatcher (Autograd key included,
// so the same autograd, autocast fallthrough and device kernels), without the
// Python op-call path (schema matching of Python arguments, boxing): several
// us of host time per call, measured on the H200 machine (README). Used by
// ops.se_block and SqueezeExcitation.forward only for plain tensors with no
// __torch_function__ override or mode and outside torch.compile; everything
// else takes torch.ops.se_module.se_block.
at::Tensor se_block_fast(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                         const at::Tensor& b2, int64_t act, int64_t version) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("se_module::se_block", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t, int64_t)>();
  return op.call(x, w1, b1, w2, b2, act, version);
}

}  // namespace

// Importing the module runs the registrations above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "se_module ops (torch.ops.se_module)";
  m.def("se_block", &se_block_fast, "torch.ops.se_module.se_block called from C++ (host fast path)");
}
