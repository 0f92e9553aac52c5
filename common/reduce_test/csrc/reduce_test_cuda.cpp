// CUDA glue for the reduction test ops.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kc/torch_utils.h"
#include "reduce_test.h"

namespace {

at::Tensor block_reduce_cuda(const at::Tensor& x_, int64_t threads) {
  TORCH_CHECK(x_.dim() == 2, "x must be 2D");
  TORCH_CHECK(threads % 32 == 0 && threads >= 32 && threads <= 1024, "threads must be a multiple of 32 in [32, 1024]");
  const at::cuda::CUDAGuard guard(x_.device());
  at::Tensor x = x_.contiguous();
  at::Tensor out = kc::new_output({x.size(0), threads, 3}, x.options().dtype(at::kFloat));
  KC_TORCH_CHECK_CUDA(launch_block_reduce_test(x.data_ptr(), kc::to_kc_dtype(x, "x"), x.size(0), x.size(1),
                                               int(threads), out.data_ptr<float>(),
                                               at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor warp_reduce_cuda(const at::Tensor& x_, int64_t width) {
  TORCH_CHECK(x_.dim() == 2 && x_.size(1) == width, "x must be [groups, width]");
  TORCH_CHECK(x_.scalar_type() == at::kFloat, "x must be float32");
  const at::cuda::CUDAGuard guard(x_.device());
  at::Tensor x = x_.contiguous();
  at::Tensor out = kc::new_output({x.size(0), width, 2}, x.options());
  KC_TORCH_CHECK_CUDA(launch_warp_reduce_test(x.data_ptr<float>(), x.size(0), int(width), out.data_ptr<float>(),
                                              at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor warp_mean_m2_cuda(const at::Tensor& x_, int64_t skip) {
  TORCH_CHECK(x_.dim() == 2 && x_.size(1) >= 1 && x_.size(1) < (int64_t(1) << 24), "x must be [rows, len], 1 <= len < 2^24");
  TORCH_CHECK(x_.scalar_type() == at::kFloat, "x must be float32");
  TORCH_CHECK(skip >= 0 && skip < 32, "skip must be in [0, 32)");
  const at::cuda::CUDAGuard guard(x_.device());
  at::Tensor x = x_.contiguous();
  at::Tensor out = kc::new_output({x.size(0), 32, 2}, x.options());
  KC_TORCH_CHECK_CUDA(launch_warp_mean_m2_test(x.data_ptr<float>(), x.size(0), int(x.size(1)), int(skip),
                                              out.data_ptr<float>(), at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kc_test, CUDA, m) {
  m.impl("block_reduce", &block_reduce_cuda);
  m.impl("warp_reduce", &warp_reduce_cuda);
  m.impl("warp_mean_m2", &warp_mean_m2_cuda);
}
