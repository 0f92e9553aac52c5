// CUDA glue: validate, pick dtypes, allocate outputs, plan the backward once
// (ln_backward_plan: kernels, grid, workspace), allocate its fp32 workspace,
// launch the plan on the current stream, check the launch.
#include <array>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "kc/torch_utils.h"
#include "layernorm.h"
#include "layernorm_autograd.h"
#include "layernorm_checks.h"

namespace day26 {
namespace {

const void* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr() : nullptr;
}

// Knob values that reach no compiled kernel (layernorm_knobs.h): an error, not a
// quiet fallback to another family.
void check_knobs(int64_t cols, bool fp32, bool forward) {
  // numbers through kc::fmt (kc/torch_utils.h: streaming an integer from an extension
  // crashes on the GPU image; this message did, 2026-11-25)
  if (ln_cluster_knob_refused(cols)) {
    const int64_t ctas = ln_knob(kKnobCluster);  // 2 or 4 here
    TORCH_CHECK(false, "day26: knob cluster=", kc::fmt(ctas), " would split rows of ", kc::fmt(cols),
                " columns into shares of ", kc::fmt(cols / ctas), "; split kernels are compiled only for shares of over ",
                kc::fmt(kClusterMinShare), " columns (version 6's own splits)");
  }
  TORCH_CHECK(!forward || !ln_l2_prefetch_knob_refused(cols, fp32),
              "day26: knob l2_prefetch=0 with forward rows that may be split across a cluster (fp32 over 8192 "
              "columns, or knob cluster set): the split forward is compiled with the L2 prefetch only");
}

c10::optional<at::Tensor> contiguous_or_none(const c10::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) return t->contiguous();
  return c10::nullopt;
}

// rms: RMSNorm on the same kernels (no centring, no bias; mean comes back undefined).
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_fwd_cuda(const at::Tensor& x_, at::IntArrayRef nshape,
                                                             const c10::optional<at::Tensor>& weight_,
                                                             const c10::optional<at::Tensor>& bias_, double eps,
                                                             int64_t version, bool rms) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  const LnShape s = ln_check_inputs(x_, nshape, weight_, bias_, /*allow_f64=*/false, version, op);  // devices too
  TORCH_CHECK(x_.is_cuda(), op, ": input must be a CUDA tensor here");
  check_knobs(s.cols, x_.scalar_type() == at::kFloat, /*forward=*/true);
  const at::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  const auto weight = contiguous_or_none(weight_), bias = contiguous_or_none(bias_);
  at::Tensor y = kc::new_output_like(x);
  at::Tensor mean = rms ? at::Tensor() : kc::new_output(s.lead, x.options().dtype(at::kFloat));
  at::Tensor rstd = kc::new_output(s.lead, x.options().dtype(at::kFloat));
  LnForwardArgs a{};
  a.x = x.data_ptr();
  a.weight = ptr_or_null(weight);
  a.bias = ptr_or_null(bias);
  a.y = y.data_ptr();
  a.mean = rms ? nullptr : mean.data_ptr<float>();
  a.rstd = rstd.data_ptr<float>();
  a.rows = s.rows;
  a.cols = s.cols;
  a.eps = float(eps);
  a.dt = kc::to_kc_dtype(x, "input");
  a.wdt = weight ? kc::to_kc_dtype(*weight, "weight") : bias ? kc::to_kc_dtype(*bias, "bias") : a.dt;
  KC_TORCH_CHECK_CUDA(ln_forward(a, int(version), at::cuda::getCurrentCUDAStream()));
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cuda(const at::Tensor& x, at::IntArrayRef nshape,
                                                                   const c10::optional<at::Tensor>& weight,
                                                                   const c10::optional<at::Tensor>& bias,
                                                                   double eps, int64_t version) {
  return norm_fwd_cuda(x, nshape, weight, bias, eps, version, /*rms=*/false);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_cuda(const at::Tensor& x, at::IntArrayRef nshape,
                                                     const c10::optional<at::Tensor>& weight, double eps,
                                                     int64_t version) {
  auto [y, mean, rstd] = norm_fwd_cuda(x, nshape, weight, c10::nullopt, eps, version, /*rms=*/true);
  return {y, rstd};
}

// A backward call's tensors (inputs made contiguous, outputs allocated), its
// arguments and its plan: what the op launches, and what _backward_plan shows.
struct BwdCall {
  at::Tensor x, dy, mean, rstd, dx, dw, db, ws;
  c10::optional<at::Tensor> weight;
  LnBackwardArgs a{};
  LnBwdPlan plan;
};

// The checks (devices too) come before the caller's CUDAGuard, which needs x on a CUDA device.
// mean_ null: RMSNorm (its messages say rms_norm).
LnShape check_backward(const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape, const at::Tensor* mean_,
                       const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_, int64_t version) {
  const char* op = mean_ ? "layer_norm" : "rms_norm";
  const LnShape s = ln_check_backward(dy_, x_, nshape, mean_, rstd_, weight_, /*allow_f64=*/false, version, op);
  TORCH_CHECK(x_.is_cuda(), op, " backward: input must be a CUDA tensor here");
  check_knobs(s.cols, x_.scalar_type() == at::kFloat, /*forward=*/false);
  return s;
}

BwdCall prepare_backward(const LnShape& s, const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape,
                         const at::Tensor& mean_, const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_,
                         std::array<bool, 3> mask, int64_t version, bool rms = false) {
  BwdCall c;
  c.x = x_.contiguous();
  c.dy = dy_.contiguous();
  c.mean = mean_.contiguous();
  c.rstd = rstd_.contiguous();
  c.weight = contiguous_or_none(weight_);
  const bool has_w = c.weight.has_value();
  const auto opts = c.x.options();
  const auto wdt = has_w ? c.weight->scalar_type() : c.x.scalar_type();
  c.dx = mask[0] ? kc::new_output_like(c.x) : at::empty({0}, opts);
  c.dw = mask[1] && has_w ? kc::new_output(nshape, opts.dtype(wdt)) : at::empty({0}, opts);
  c.db = mask[2] ? kc::new_output(nshape, opts.dtype(wdt)) : at::empty({0}, opts);
  LnBackwardArgs& a = c.a;
  a.dy = c.dy.data_ptr();
  a.x = c.x.data_ptr();
  a.mean = rms ? nullptr : c.mean.data_ptr<float>();
  a.rstd = c.rstd.data_ptr<float>();
  a.weight = ptr_or_null(c.weight);
  a.dx = mask[0] ? c.dx.data_ptr() : nullptr;
  a.dweight = mask[1] && has_w ? c.dw.data_ptr() : nullptr;
  a.dbias = mask[2] ? c.db.data_ptr() : nullptr;
  a.rows = s.rows;
  a.cols = s.cols;
  a.dt = kc::to_kc_dtype(c.x, "input");
  a.wdt = has_w ? kc::to_kc_dtype(*c.weight, "weight") : a.dt;
  c.plan = ln_backward_plan(a, int(version), ln_device());
  return c;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cuda(
    const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape, const at::Tensor& mean_,
    const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_, std::array<bool, 3> mask, int64_t version) {
  const LnShape s = check_backward(dy_, x_, nshape, &mean_, rstd_, weight_, version);
  const at::cuda::CUDAGuard guard(x_.device());
  BwdCall c = prepare_backward(s, dy_, x_, nshape, mean_, rstd_, weight_, mask, version);
  if (c.plan.workspace_floats > 0) {
    c.ws = at::empty({c.plan.workspace_floats}, c.x.options().dtype(at::kFloat));
    c.a.workspace = c.ws.data_ptr<float>();
  }
  KC_TORCH_CHECK_CUDA(ln_backward(c.a, c.plan, at::cuda::getCurrentCUDAStream()));
  // One column: x - mean is 0, so dx is exactly 0, which the 16-bit kernels'
  // folded constants (rstd * g - rstd * mean(g), rounded apart) would miss.
  if (s.cols == 1 && mask[0]) c.dx.zero_();
  return {c.dx, c.dw, c.db};
}

// RMSNorm's backward: the LayerNorm plan and kernels with the mean pointer null
// (rstd stands in for mean in the shared checks; no dbias).
std::tuple<at::Tensor, at::Tensor> rms_norm_bwd_cuda(const at::Tensor& dy_, const at::Tensor& x_,
                                                     at::IntArrayRef nshape, const at::Tensor& rstd_,
                                                     const c10::optional<at::Tensor>& weight_, std::array<bool, 2> m,
                                                     int64_t version) {
  const LnShape s = check_backward(dy_, x_, nshape, nullptr, rstd_, weight_, version);
  const at::cuda::CUDAGuard guard(x_.device());
  const std::array<bool, 3> mask = {m[0], m[1], false};
  BwdCall c = prepare_backward(s, dy_, x_, nshape, rstd_, rstd_, weight_, mask, version, /*rms=*/true);
  if (c.plan.workspace_floats > 0) {
    c.ws = at::empty({c.plan.workspace_floats}, c.x.options().dtype(at::kFloat));
    c.a.workspace = c.ws.data_ptr<float>();
  }
  KC_TORCH_CHECK_CUDA(ln_backward(c.a, c.plan, at::cuda::getCurrentCUDAStream()));
  return {c.dx, c.dw};
}

// The private _backward_plan (binding.cpp): the plan of this call, as (name, value) pairs.
std::vector<std::pair<std::string, int64_t>> backward_plan_query(
    const at::Tensor& dy, const at::Tensor& x, at::IntArrayRef nshape, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& weight, std::array<bool, 3> mask, int64_t version) {
  const LnShape s = check_backward(dy, x, nshape, &mean, rstd, weight, version);
  const at::cuda::CUDAGuard guard(x.device());
  const LnBwdPlan p = prepare_backward(s, dy, x, nshape, mean, rstd, weight, mask, version).plan;
  const LnDevice d = ln_device();
  return {{"version", p.version},     {"family", p.family},
          {"partials", p.partials},   {"vec", p.vec},
          {"iters", p.iters},         {"tpr", p.tpr},
          {"warp", p.warp},           {"prefetch", p.prefetch},
          {"stages", p.stages},       {"cluster", p.cluster},
          {"slots", p.slots},         {"threads", p.threads},
          {"grid", p.grid},           {"smem", int64_t(p.smem)},
          {"partial_rows", p.partial_rows}, {"workspace_floats", p.workspace_floats},
          {"finalize", p.finalize},   {"sms", d.sms},
          {"cc", d.cc}};
}

const bool registered = (ln_backward_plan_query() = &backward_plan_query, true);

}  // namespace
}  // namespace day26

TORCH_LIBRARY_IMPL(day26, CUDA, m) {
  m.impl("layer_norm_fwd", &day26::layer_norm_fwd_cuda);
  m.impl("layer_norm_bwd", &day26::layer_norm_bwd_cuda);
  m.impl("rms_norm_fwd", &day26::rms_norm_fwd_cuda);
  m.impl("rms_norm_bwd", &day26::rms_norm_bwd_cuda);
}
