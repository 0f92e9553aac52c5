// Argument validation shared by the CPU and CUDA implementations (torch side).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kc/torch_utils.h"

namespace day50 {

// Numbers in error messages go through kc::fmt (kc/torch_utils.h): streaming
// an integer or a double into TORCH_CHECK crashed inside the extension on the
// GPU image (cuda-gdb backtrace, 2026-11-21).
using kc::fmt;

enum class Backend { Auto, Fused, Simt, Naive };

inline Backend parse_backend(const std::string& s) {
  if (s == "auto") return Backend::Auto;
  if (s == "fused") return Backend::Fused;
  if (s == "simt") return Backend::Simt;
  if (s == "naive") return Backend::Naive;
  TORCH_CHECK(false, "backend must be \"auto\", \"fused\", \"simt\" or \"naive\", got \"", s, "\"");
  return Backend::Auto;
}

// The layout of the outputs out and dq (B, H, N, d): q's dimension order, dense; of dk and
// dv: k's and v's. The input's dimensions sorted by stride, largest first (ties keep their
// order); when d comes last, that order, else plain contiguous. A (B, N, H, d).transpose(1, 2)
// view of q thus gives out and dq with (B, N, H, d) memory, as SDPA's kernels return them:
// a model that transposes the output back reshapes it without a copy, and gradients of q, k,
// v sliced from one projection reshape back without one. Every backend and the fake
// (ops.py, _layout_strides) follow this one rule, so compiled graphs see the real strides.
inline std::array<int64_t, 4> layout_strides(const at::Tensor& like, at::IntArrayRef sizes) {
  std::array<int64_t, 4> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  if (order[3] != 3) order = {0, 1, 2, 3};
  std::array<int64_t, 4> strides{};
  int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    strides[order[i]] = s;
    s *= std::max<int64_t>(sizes[order[i]], 1);
  }
  return strides;
}

// A new output of `sizes` in like's layout (layout_strides); NaN-filled when the tests
// poison outputs (kc::new_output), so an element no kernel writes shows.
inline at::Tensor new_output_in_layout_of(const at::Tensor& like, at::IntArrayRef sizes,
                                          const at::TensorOptions& opts) {
  const auto st = layout_strides(like, sizes);
  at::Tensor t = at::empty_strided(sizes, st, opts);
  if (kc::poison_outputs() && t.numel() > 0 && at::isFloatingType(t.scalar_type())) t.fill_(NAN);
  return t;
}

inline bool is_supported_dtype(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// The dtype of lse (and of grad_lse): float64 for float64 inputs, else float32.
inline at::ScalarType lse_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// q (B, H, Nq, d), k and v (B, Hk, Nk, d): same dtype and device. Hk == H is
// multi-head attention; Hk < H, dividing H, is grouped-query attention with the
// semantics of SDPA's enable_gqa=True (q head h reads k/v head h / (H / Hk);
// Hk == 1 is multi-query attention). Returns the scale.
inline double check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        std::optional<double> scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k, v must be 4-D (B, H, N, d), got ", fmt(q.dim()), "-D, ", fmt(k.dim()), "-D, ", fmt(v.dim()), "-D");
  TORCH_CHECK(is_supported_dtype(q.scalar_type()),
              "attention: q must be float64, float32, float16 or bfloat16, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "attention: q, k, v must have the same dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  // A mix that includes the meta device never reaches here (the dispatcher picks the fake,
  // ops.py's _check_one_device); every other mix stops here, naming each device.
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "attention: all tensors must be on one device, got q on ", q.device(), ", k on ", k.device(),
              ", v on ", v.device());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "attention: batch sizes of q ", fmt(q.sizes()),
              ", k ", fmt(k.sizes()), ", v ", fmt(v.sizes()), " differ");
  TORCH_CHECK(k.size(1) == v.size(1), "attention: k and v must have the same number of heads, got k ",
              fmt(k.sizes()), " and v ", fmt(v.sizes()));
  const int64_t hq = q.size(1), hk = k.size(1);
  TORCH_CHECK(hk == hq || (hk > 0 && hq > 0 && hq % hk == 0), "attention: the number of q heads (",
              fmt(hq), ") must be a positive multiple of the number of k and v heads (", fmt(hk),
              "): grouped-query attention maps q head h to k/v head h / (Hq / Hkv); q ", fmt(q.sizes()), ", k ",
              fmt(k.sizes()));
  TORCH_CHECK(k.size(2) == v.size(2), "attention: k and v must have the same sequence length, got ", fmt(k.size(2)),
              " and ", fmt(v.size(2)));
  TORCH_CHECK(k.size(3) == q.size(3) && v.size(3) == q.size(3),
              "attention: q, k, v must have the same head dim, got ", fmt(q.size(3)), ", ", fmt(k.size(3)), ", ",
              fmt(v.size(3)));
  TORCH_CHECK(q.size(3) > 0, "attention: head dim must be positive");
  const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(double(q.size(3)));
  TORCH_CHECK(std::isfinite(s), "attention: scale must be finite, got ", fmt(s));
  return s;
}

// The extra tensors of the backward: grad_out and out like q, lse (B, H, Nq).
inline void check_backward_args(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& out,
                                const at::Tensor& lse, const std::optional<at::Tensor>& grad_lse) {
  TORCH_CHECK(grad_out.sizes() == q.sizes() && out.sizes() == q.sizes(),
              "attention_backward: grad_out ", fmt(grad_out.sizes()), " and out ", fmt(out.sizes()),
              " must have q's shape ", fmt(q.sizes()));
  TORCH_CHECK(grad_out.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "attention_backward: grad_out and out must have q's dtype ", q.scalar_type());
  TORCH_CHECK(grad_out.device() == q.device() && out.device() == q.device() && lse.device() == q.device(),
              "attention_backward: all tensors must be on one device, got q on ", q.device(), ", grad_out on ",
              grad_out.device(), ", out on ", out.device(), ", lse on ", lse.device());
  const auto want = std::vector<int64_t>{q.size(0), q.size(1), q.size(2)};
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(want), "attention_backward: lse must be (B, H, Nq) = ",
              fmt(at::IntArrayRef(want)), ", got ", fmt(lse.sizes()));
  TORCH_CHECK(lse.scalar_type() == lse_dtype(q.scalar_type()), "attention_backward: lse must be ",
              lse_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", lse.scalar_type());
  if (grad_lse.has_value()) {
    TORCH_CHECK(grad_lse->sizes() == lse.sizes() && grad_lse->scalar_type() == lse.scalar_type() &&
                    grad_lse->device() == lse.device(),
                "attention_backward: grad_lse must match lse (", fmt(lse.sizes()), ", ", lse.scalar_type(), ")");
  }
}

// The gradients' dtypes: q's, k's and v's, unless the backward is asked for others (dq_dtype,
// dk_dtype, dv_dtype). The autograd node of a call under autocast asks for the dtypes of the
// tensors it cast (float32 q and k after RoPE), so the gradients reach them without a cast
// kernel each: the fused backward stores float32 from its fp32 sums (FusedParams::dq_f32),
// other paths compute in the inputs' dtype and convert (to_grad_dtypes).
struct GradDtypes {
  at::ScalarType q, k, v;
};

inline GradDtypes grad_dtypes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              std::optional<at::ScalarType> dq, std::optional<at::ScalarType> dk,
                              std::optional<at::ScalarType> dv, const char* op) {
  auto pick = [op](std::optional<at::ScalarType> want, const at::Tensor& t, const char* name) {
    if (!want.has_value()) return t.scalar_type();
    TORCH_CHECK(is_supported_dtype(*want), op, ": ", name, " must be float64, float32, float16 or bfloat16, got ",
                *want);
    return *want;
  };
  return {pick(dq, q, "dq_dtype"), pick(dk, k, "dk_dtype"), pick(dv, v, "dv_dtype")};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> to_grad_dtypes(
    std::tuple<at::Tensor, at::Tensor, at::Tensor> g, const GradDtypes& dt) {
  auto& [dq, dk, dv] = g;
  return {dq.to(dt.q), dk.to(dt.k), dv.to(dt.v)};  // strides kept (preserve_format)
}

// Nk = 0: every query sees no key, so each row gets what a row outside its window gets: out
// 0, lse +inf, no gradient (SDPA's math returns the same zeros). No kernel runs.
inline bool no_keys(const at::Tensor& k) { return k.size(2) == 0; }

inline std::tuple<at::Tensor, at::Tensor> no_keys_forward(const at::Tensor& q) {
  at::Tensor out = new_output_in_layout_of(q, q.sizes(), q.options()).zero_();
  at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, std::numeric_limits<double>::infinity(),
                            q.options().dtype(lse_dtype(q.scalar_type())));
  return {out, lse};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> no_keys_backward(const at::Tensor& q, const at::Tensor& k,
                                                                       const at::Tensor& v, const GradDtypes& gd) {
  return {new_output_in_layout_of(q, q.sizes(), q.options().dtype(gd.q)).zero_(),
          new_output_in_layout_of(k, k.sizes(), k.options().dtype(gd.k)),
          new_output_in_layout_of(v, v.sizes(), v.options().dtype(gd.v))};
}

}  // namespace day50
