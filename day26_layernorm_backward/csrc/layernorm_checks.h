// Argument validation shared by the CPU and CUDA implementations, so both give
// the same clear errors for the same bad input.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kc/torch_utils.h"
#include "layernorm_versions.h"

namespace day26 {

struct LnShape {
  int64_t rows = 0;  // product of the leading dims
  int64_t cols = 0;  // product of normalized_shape
  std::vector<int64_t> lead;
};

inline bool ln_dtype_ok(const at::Tensor& t, bool allow_f64) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || (allow_f64 && s == at::kDouble);
}

// Also the one check of the version's range (layernorm_versions.h): every op
// (CPU, CUDA; forward through ln_check_backward too) validates it here. `op`
// names the user's function in every message ("layer_norm", "rms_norm", "add_norm").
inline LnShape ln_check_inputs(const at::Tensor& x, at::IntArrayRef normalized_shape,
                               const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                               bool allow_f64, int64_t version, const char* op = "layer_norm") {
  TORCH_CHECK(ln_version_ok(version), op, ": version must be ", kc::fmt(int64_t(kMinVersion)), " (auto) to ",
              kc::fmt(int64_t(kMaxVersion)), ", got ", kc::fmt(version));
  TORCH_CHECK(ln_dtype_ok(x, allow_f64), op, ": input must be float32, float16 or bfloat16",
              allow_f64 ? " (or float64 on CPU)" : "", ", got ", x.scalar_type());
  const int64_t k = int64_t(normalized_shape.size());
  TORCH_CHECK(k >= 1, op, ": normalized_shape must have at least one dimension");
  TORCH_CHECK(x.dim() >= k, op, ": input of shape ", kc::fmt(x.sizes()), " has fewer dims than normalized_shape ",
              kc::fmt(normalized_shape));
  TORCH_CHECK(x.sizes().slice(x.dim() - k).equals(normalized_shape), op, ": normalized_shape ",
              kc::fmt(normalized_shape), " does not match the last ", kc::fmt(k), " dims of input of shape ",
              kc::fmt(x.sizes()));
  LnShape s;
  s.cols = 1;  // 0 (a dim of size 0): every output is empty, the statistics as torch's (mean 0, rstd NaN)
  for (auto d : normalized_shape) s.cols *= d;
  s.rows = 1;
  for (int64_t i = 0; i < x.dim() - k; ++i) {
    s.lead.push_back(x.size(i));
    s.rows *= x.size(i);
  }
  for (const auto* p : {&weight, &bias}) {
    if (!p->has_value() || !(*p)->defined()) continue;
    const at::Tensor& t = **p;
    const char* name = p == &weight ? "weight" : "bias";
    TORCH_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(), " but input is on ",
                x.device());
    TORCH_CHECK(t.scalar_type() == x.scalar_type() || t.scalar_type() == at::kFloat, op, ": ", name,
                " must have the input's dtype (", x.scalar_type(), ") or float32, got ", t.scalar_type());
    TORCH_CHECK(t.sizes().equals(normalized_shape), op, ": ", name, " of shape ", kc::fmt(t.sizes()),
                " must have normalized_shape ", kc::fmt(normalized_shape));
  }
  if (weight.has_value() && weight->defined() && bias.has_value() && bias->defined())
    TORCH_CHECK(weight->scalar_type() == bias->scalar_type(), op, ": weight (", weight->scalar_type(),
                ") and bias (", bias->scalar_type(), ") must have the same dtype");
  return s;
}

// mean null: RMSNorm (rstd the only statistic).
inline LnShape ln_check_backward(const at::Tensor& dy, const at::Tensor& x, at::IntArrayRef normalized_shape,
                                 const at::Tensor* mean, const at::Tensor& rstd,
                                 const c10::optional<at::Tensor>& weight, bool allow_f64, int64_t version,
                                 const char* op = "layer_norm") {
  LnShape s = ln_check_inputs(x, normalized_shape, weight, c10::nullopt, allow_f64, version, op);
  TORCH_CHECK(dy.sizes().equals(x.sizes()), op, " backward: grad_out of shape ", kc::fmt(dy.sizes()),
              " must match input of shape ", kc::fmt(x.sizes()));
  TORCH_CHECK(dy.scalar_type() == x.scalar_type(), op, " backward: grad_out dtype ", dy.scalar_type(),
              " must match input dtype ", x.scalar_type());
  TORCH_CHECK(dy.device() == x.device(), op, " backward: grad_out is on ", dy.device(), " but input is on ",
              x.device());
  for (const at::Tensor* t : {mean, &rstd}) {
    if (!t) continue;
    const char* name = t == mean ? "mean" : "rstd";
    TORCH_CHECK(t->device() == x.device(), op, " backward: ", name, " is on ", t->device(),
                " but input is on ", x.device());
    TORCH_CHECK(t->scalar_type() == (x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat),
                op, " backward: ", name, " must be float32 (float64 for float64 input), got ",
                t->scalar_type());
    TORCH_CHECK(t->numel() == s.rows, op, " backward: ", name, " has ", kc::fmt(t->numel()), " elements, expected ",
                kc::fmt(s.rows), " (one per normalized row)");
  }
  return s;
}

// add_norm: a tensor that must match `like` (x for the residual, the saved sum
// for the sum's gradient) in shape, dtype and device.
inline void ln_check_same(const at::Tensor& like, const at::Tensor& t, const char* op, const char* name,
                          const char* like_name) {
  TORCH_CHECK(t.device() == like.device(), op, ": ", name, " is on ", t.device(), " but ", like_name, " is on ",
              like.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), op, ": ", name, " (", t.scalar_type(), ") and ", like_name, " (",
              like.scalar_type(), ") must have one dtype");
  TORCH_CHECK(t.sizes().equals(like.sizes()), op, ": ", name, " of shape ", kc::fmt(t.sizes()), " and ", like_name,
              " of shape ", kc::fmt(like.sizes()), " must have one shape");
}

}  // namespace day26
