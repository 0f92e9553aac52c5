// Schemas of the se_module ops. Implementations: se_cpu.cpp (CPU) and
// se_cuda.cpp (CUDA); autograd and fake tensors: se_module/ops.py.
#include <torch/library.h>
#include <torch/python.h>

#include "kc/torch_utils.h"

#include "se_dispatch.h"

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
#define SE_DEFAULT_VERSION "7"
  m.def("se_block(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int activation, "
        "int version=" SE_DEFAULT_VERSION ", int scale_activation=0) -> Tensor");
  // se_block_train: the forward of a training step, which also returns the values that
  // version 6's backward reads (state, fp32 [N, 3 C + 2 S]; se_module.h, "The saved
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

// Importing the module runs the registrations above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "se_module ops (torch.ops.se_module)";
  kc::bind_test_hooks(m);
  m.def("se_block", &se_glue::call_se_block, "torch.ops.se_module.se_block called from C++ (host fast path)");
}
