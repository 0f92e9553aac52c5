// CUDA glue: validate, pick dtypes, allocate outputs (and the fp32 workspace of
// the dweight/dbias partials), launch on the current stream, check the launch.
#include <array>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "kc/torch_utils.h"
#include "layernorm.h"
#include "layernorm_checks.h"

namespace day26 {
namespace {

const void* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr() : nullptr;
}

c10::optional<at::Tensor> contiguous_or_none(const c10::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) return t->contiguous();
  return c10::nullopt;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cuda(const at::Tensor& x_, at::IntArrayRef nshape,
                                                                   const c10::optional<at::Tensor>& weight_,
                                                                   const c10::optional<at::Tensor>& bias_,
                                                                   double eps, int64_t version) {
  TORCH_CHECK(x_.is_cuda(), "layer_norm: input must be a CUDA tensor here");
  const LnShape s = ln_check_inputs(x_, nshape, weight_, bias_, /*allow_f64=*/false);
  TORCH_CHECK(version >= 1 && version <= 4, "layer_norm: version must be 1, 2, 3 or 4, got ", kc::fmt(version));
  const at::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  const auto weight = contiguous_or_none(weight_), bias = contiguous_or_none(bias_);
  at::Tensor y = kc::new_output_like(x);
  at::Tensor mean = kc::new_output(s.lead, x.options().dtype(at::kFloat));
  at::Tensor rstd = kc::new_output(s.lead, x.options().dtype(at::kFloat));
  LnForwardArgs a{};
  a.x = x.data_ptr();
  a.weight = ptr_or_null(weight);
  a.bias = ptr_or_null(bias);
  a.y = y.data_ptr();
  a.mean = mean.data_ptr<float>();
  a.rstd = rstd.data_ptr<float>();
  a.rows = s.rows;
  a.cols = s.cols;
  a.eps = float(eps);
  a.dt = kc::to_kc_dtype(x, "input");
  a.wdt = weight ? kc::to_kc_dtype(*weight, "weight") : bias ? kc::to_kc_dtype(*bias, "bias") : a.dt;
  KC_TORCH_CHECK_CUDA(ln_forward(a, int(version), at::cuda::getCurrentCUDAStream()));
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cuda(
    const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape, const at::Tensor& mean_,
    const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_, std::array<bool, 3> mask, int64_t version) {
  TORCH_CHECK(x_.is_cuda(), "layer_norm backward: input must be a CUDA tensor here");
  const LnShape s = ln_check_backward(dy_, x_, nshape, mean_, rstd_, weight_, /*allow_f64=*/false);
  TORCH_CHECK(version >= 1 && version <= 4, "layer_norm backward: version must be 1, 2, 3 or 4, got ", kc::fmt(version));
  const at::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous(), dy = dy_.contiguous();
  const at::Tensor mean = mean_.contiguous(), rstd = rstd_.contiguous();
  const auto weight = contiguous_or_none(weight_);
  const bool has_w = weight.has_value();
  const auto wdt = has_w ? weight->scalar_type() : x.scalar_type();
  at::Tensor dx = mask[0] ? kc::new_output_like(x) : at::empty({0}, x.options());
  at::Tensor dw = mask[1] && has_w ? kc::new_output(nshape, x.options().dtype(wdt)) : at::empty({0}, x.options());
  at::Tensor db = mask[2] ? kc::new_output(nshape, x.options().dtype(wdt)) : at::empty({0}, x.options());

  LnBackwardArgs a{};
  a.dy = dy.data_ptr();
  a.x = x.data_ptr();
  a.mean = mean.data_ptr<float>();
  a.rstd = rstd.data_ptr<float>();
  a.weight = ptr_or_null(weight);
  a.dx = mask[0] ? dx.data_ptr() : nullptr;
  a.dweight = mask[1] && has_w ? dw.data_ptr() : nullptr;
  a.dbias = mask[2] ? db.data_ptr() : nullptr;
  a.rows = s.rows;
  a.cols = s.cols;
  a.dt = kc::to_kc_dtype(x, "input");
  a.wdt = has_w ? kc::to_kc_dtype(*weight, "weight") : a.dt;
  at::Tensor ws;
  if (a.dweight || a.dbias) {
    const int64_t n = ln_backward_workspace_floats(a, int(version));
    ws = at::empty({n > 0 ? n : 1}, x.options().dtype(at::kFloat));
    a.workspace = ws.data_ptr<float>();
  }
  KC_TORCH_CHECK_CUDA(ln_backward(a, int(version), at::cuda::getCurrentCUDAStream()));
  return {dx, dw, db};
}

}  // namespace
}  // namespace day26

TORCH_LIBRARY_IMPL(day26, CUDA, m) {
  m.impl("layer_norm_fwd", &day26::layer_norm_fwd_cuda);
  m.impl("layer_norm_bwd", &day26::layer_norm_bwd_cuda);
}
