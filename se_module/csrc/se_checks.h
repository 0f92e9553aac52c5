// se_checks.h: argument checks and layout rules shared by the CPU and CUDA
// implementations (torch side only; the kernels never see this file).
//
// Layout rule (the fakes in se_module/ops.py follow the same rule):
//   an output shaped like x is channels_last when x is channels_last-dense and
//   not NCHW-dense, and NCHW-contiguous otherwise (x with other strides is
//   copied to NCHW first). When x is both (C == 1 or H * W == 1) the two layouts
//   are the same bytes.
#pragma once

#include <string>

#include <ATen/ATen.h>

#include "kc/torch_utils.h"
#include "se_plan.h"

namespace se_glue {

// Numbers in error messages go through kc::fmt (kc/torch_utils.h): streaming an
// integer into TORCH_CHECK crashed inside the extension on the GPU image
// (torch 2.11). Strings, ScalarType and Device stream fine.
using kc::fmt;

inline bool wants_channels_last(const at::Tensor& x) {
  return !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

inline at::MemoryFormat out_format(const at::Tensor& x) {
  return wants_channels_last(x) ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

inline void check_floating(const at::Tensor& t, const char* name) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), name, " must be a floating-point tensor, got ", t.scalar_type());
}

inline void check_x(const at::Tensor& x, const char* name = "x") {
  TORCH_CHECK(x.dim() == 4, name, " must be 4-D [N, C, H, W], got ", fmt(x.dim()), "-D with sizes ", fmt(x.sizes()));
  check_floating(x, name);
  TORCH_CHECK(x.size(1) >= 1 && x.size(2) >= 1 && x.size(3) >= 1, name,
              " must have C, H and W of at least 1, got sizes ", fmt(x.sizes()));
}

inline void check_same_device(const at::Tensor& a, const char* an, const at::Tensor& b, const char* bn) {
  TORCH_CHECK(a.device() == b.device(), an, " and ", bn, " must be on the same device, got ", a.device(), " and ",
              b.device());
}

inline void check_like_x(const at::Tensor& g, const char* gn, const at::Tensor& x) {
  TORCH_CHECK(g.sizes() == x.sizes(), gn, " must have x's shape ", fmt(x.sizes()), ", got ", fmt(g.sizes()));
  TORCH_CHECK(g.scalar_type() == x.scalar_type(), gn, " must have x's dtype ", x.scalar_type(), ", got ",
              g.scalar_type());
  check_same_device(g, gn, x, "x");
}

// s: [N, C] per-channel factors of x.
inline void check_nc(const at::Tensor& s, const char* sn, const at::Tensor& x) {
  TORCH_CHECK(s.dim() == 2 && s.size(0) == x.size(0) && s.size(1) == x.size(1), sn, " must be [N, C] = [",
              fmt(x.size(0)), ", ", fmt(x.size(1)), "], got ", fmt(s.sizes()));
  check_floating(s, sn);
  check_same_device(s, sn, x, "x");
}

// A 1x1 conv weight [O, I, 1, 1] or the matrix [O, I] itself.
inline bool is_matrix_or_1x1(const at::Tensor& w) {
  return w.dim() == 2 || (w.dim() == 4 && w.size(2) == 1 && w.size(3) == 1);
}

// fc1: w1 [S, C] (or [S, C, 1, 1]), b1 [S]; fc2: w2 [C, S] (or [C, S, 1, 1]), b2 [C]. Returns S.
inline int64_t check_weights(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                             const at::Tensor& b2) {
  const int64_t C = x.size(1);
  TORCH_CHECK(is_matrix_or_1x1(w1), "w1 (fc1.weight) must be [S, C] or [S, C, 1, 1], got sizes ", fmt(w1.sizes()));
  const int64_t S = w1.size(0);
  TORCH_CHECK(S >= 1, "the squeeze width S = w1.size(0) must be at least 1, got ", fmt(S));
  TORCH_CHECK(w1.size(1) == C, "w1 must be [S, C] with C = x.size(1) = ", fmt(C), ", got ", fmt(w1.sizes()));
  TORCH_CHECK(b1.dim() == 1 && b1.size(0) == S, "b1 (fc1.bias) must be [S] = [", fmt(S), "], got ", fmt(b1.sizes()));
  TORCH_CHECK(is_matrix_or_1x1(w2) && w2.size(0) == C && w2.size(1) == S, "w2 (fc2.weight) must be [C, S] = [",
              fmt(C), ", ", fmt(S), "] (or [C, S, 1, 1]), got ", fmt(w2.sizes()));
  TORCH_CHECK(b2.dim() == 1 && b2.size(0) == C, "b2 (fc2.bias) must be [C] = [", fmt(C), "], got ", fmt(b2.sizes()));
  const char* names[] = {"w1", "b1", "w2", "b2"};
  const at::Tensor* ts[] = {&w1, &b1, &w2, &b2};
  for (int i = 0; i < 4; ++i) {
    check_floating(*ts[i], names[i]);
    check_same_device(*ts[i], names[i], x, "x");
  }
  return S;
}

// Columns of se_block_train's saved state [N, 3 C + 2 S] (se_module.h, "The saved
// state"; ops.py's fake has the same shape).
inline int64_t state_cols(int64_t C, int64_t S) { return 3 * C + 2 * S; }

// se_block_backward's optional state: se_block_train's second output for the same x.
inline void check_state(const at::Tensor& st, const at::Tensor& x, int64_t S) {
  const int64_t N = x.size(0), cols = state_cols(x.size(1), S);
  TORCH_CHECK(st.dim() == 2 && st.size(0) == N && st.size(1) == cols && st.scalar_type() == at::kFloat &&
                  st.is_contiguous(),
              "state must be se_block_train's contiguous float32 [N, 3 C + 2 S] = [", fmt(N), ", ", fmt(cols),
              "], got ", st.scalar_type(), " ", fmt(st.sizes()));
  check_same_device(st, "state", x, "x");
}

// The codes of se_module.h's Act and Gate (ops.py's activation_code / scale_activation_code).
inline void check_activation(int64_t act) {
  TORCH_CHECK(act >= 0 && act <= 2, "activation must be 0 (ReLU), 1 (SiLU) or 2 (Hardswish), got ", fmt(act));
}

inline void check_scale_activation(int64_t gate) {
  TORCH_CHECK(gate == 0 || gate == 1, "scale_activation must be 0 (Sigmoid) or 1 (Hardsigmoid), got ", fmt(gate));
}

inline void check_fused_version(int64_t v) {
  TORCH_CHECK(se::valid_fused_version(v),
              "version must be 0 (auto: the plan picks the kernels), 1 (the fused block), 2 (+ the spread MLP) "
              "or 3 (+ the cluster kernel), got ", fmt(v),
              (v >= 4 && v <= 7) ? "; versions 4-7 of earlier releases are features of the plan now: pass 0" : "");
}

inline void check_pool_version(int64_t v) {
  TORCH_CHECK(v == 1 || v == 2, "version must be 1 (seed: a thread per (n, c)) or 2 (split reduction), got ", fmt(v));
}

}  // namespace se_glue
