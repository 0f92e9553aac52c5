// Schemas of the reduction test ops (CUDA-only implementations).
#include <pybind11/pybind11.h>
#include <torch/library.h>

TORCH_LIBRARY(kc_test, m) {
  m.def("block_reduce(Tensor x, int threads) -> Tensor");
  m.def("warp_reduce(Tensor x, int width) -> Tensor");
  m.def("warp_mean_m2(Tensor x, int skip) -> Tensor");
}

// Importing the module runs the registrations above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.doc() = "kernel_common reduction test ops"; }
