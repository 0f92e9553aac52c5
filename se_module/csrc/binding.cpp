// Schemas of the se_module ops. Implementations: se_cpu.cpp (CPU) and
// se_cuda.cpp (CUDA); autograd and fake tensors: se_module/ops.py.
#include <pybind11/pybind11.h>
#include <torch/library.h>

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

// Importing the module runs the registrations above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.doc() = "se_module ops (torch.ops.se_module)"; }
