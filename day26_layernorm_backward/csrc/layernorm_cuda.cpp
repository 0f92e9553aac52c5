// CUDA glue: validate, pick dtypes, allocate outputs, plan the backward once
// (ln_backward_plan: kernels, grid, workspace), allocate its fp32 workspace,
// launch the plan on the current stream, check the launch.
#include <array>
#include <limits>

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

struct FwdOut {
  at::Tensor y, sum, mean, rstd;
};

// A forward call's tensors (inputs made contiguous, outputs allocated) and its
// arguments: what the op launches, and what _forward_plan plans.
struct FwdCall {
  at::Tensor x, residual;
  c10::optional<at::Tensor> weight, bias;
  FwdOut o;
  LnForwardArgs a{};
};

// rms: RMSNorm on the same kernels (no centring, no bias; mean comes back
// undefined). residual_ (add_norm): the norm of x + residual, the sum returned too.
FwdCall prepare_forward(const at::Tensor& x_, at::IntArrayRef nshape, const c10::optional<at::Tensor>& weight_,
                        const c10::optional<at::Tensor>& bias_, double eps, int64_t version, bool rms,
                        const at::Tensor* residual_) {
  const char* op = residual_ ? "add_norm" : rms ? "rms_norm" : "layer_norm";
  const LnShape s = ln_check_inputs(x_, nshape, weight_, bias_, /*allow_f64=*/false, version, op);  // devices too
  if (residual_) ln_check_same(x_, *residual_, op, "residual", "input");
  TORCH_CHECK(x_.is_cuda(), op, ": input must be a CUDA tensor here");
  check_knobs(s.cols, x_.scalar_type() == at::kFloat, /*forward=*/true);
  FwdCall c;
  c.x = x_.contiguous();
  c.weight = contiguous_or_none(weight_);
  c.bias = contiguous_or_none(bias_);
  FwdOut& o = c.o;
  LnForwardArgs& a = c.a;
  o.y = kc::new_output_like(c.x);
  if (rms) o.mean = residual_ ? at::empty({0}, c.x.options().dtype(at::kFloat)) : at::Tensor();
  else o.mean = kc::new_output(s.lead, c.x.options().dtype(at::kFloat));
  o.rstd = kc::new_output(s.lead, c.x.options().dtype(at::kFloat));
  if (residual_) {
    c.residual = residual_->contiguous();
    o.sum = kc::new_output_like(c.x);
    a.residual = c.residual.data_ptr();
    a.sum = o.sum.data_ptr();
  }
  a.x = c.x.data_ptr();
  a.weight = ptr_or_null(c.weight);
  a.bias = ptr_or_null(c.bias);
  a.y = o.y.data_ptr();
  a.mean = rms ? nullptr : o.mean.data_ptr<float>();
  a.rstd = o.rstd.data_ptr<float>();
  a.rows = s.rows;
  a.cols = s.cols;
  a.eps = float(eps);
  a.dt = kc::to_kc_dtype(c.x, "input");
  a.wdt = c.weight ? kc::to_kc_dtype(*c.weight, "weight") : c.bias ? kc::to_kc_dtype(*c.bias, "bias") : a.dt;
  return c;
}

FwdOut norm_fwd_cuda(const at::Tensor& x, at::IntArrayRef nshape, const c10::optional<at::Tensor>& weight,
                     const c10::optional<at::Tensor>& bias, double eps, int64_t version, bool rms,
                     const at::Tensor* residual = nullptr) {
  FwdCall c = prepare_forward(x, nshape, weight, bias, eps, version, rms, residual);  // checks x is CUDA
  const at::cuda::CUDAGuard guard(x.device());
  if (c.a.cols == 0) {  // rows of no element: y (and the sum) empty, mean 0 and rstd NaN, as torch's
    if (!rms) c.o.mean.zero_();
    c.o.rstd.fill_(std::numeric_limits<float>::quiet_NaN());
    return c.o;
  }
  KC_TORCH_CHECK_CUDA(ln_forward(c.a, int(version), at::cuda::getCurrentCUDAStream()));
  return c.o;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cuda(const at::Tensor& x, at::IntArrayRef nshape,
                                                                   const c10::optional<at::Tensor>& weight,
                                                                   const c10::optional<at::Tensor>& bias,
                                                                   double eps, int64_t version) {
  FwdOut o = norm_fwd_cuda(x, nshape, weight, bias, eps, version, /*rms=*/false);
  return {o.y, o.mean, o.rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_cuda(const at::Tensor& x, at::IntArrayRef nshape,
                                                     const c10::optional<at::Tensor>& weight, double eps,
                                                     int64_t version) {
  FwdOut o = norm_fwd_cuda(x, nshape, weight, c10::nullopt, eps, version, /*rms=*/true);
  return {o.y, o.rstd};
}

// add_norm: (norm(x + residual), x + residual, mean ([0] for rms), rstd), the add
// fused into the norm kernel's load where the plan has such a kernel.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_norm_fwd_cuda(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef nshape, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, double eps, bool rms, int64_t version) {
  TORCH_CHECK(!rms || !(bias.has_value() && bias->defined()), "add_norm: kind 'rms' takes no bias");
  FwdOut o = norm_fwd_cuda(x, nshape, weight, bias, eps, version, rms, &residual);
  return {o.y, o.sum, o.mean, o.rstd};
}

// A backward call's tensors (inputs made contiguous, outputs allocated), its
// arguments and its plan: what the op launches, and what _backward_plan shows.
struct BwdCall {
  at::Tensor x, dy, mean, rstd, dx, dw, db, ws, dsum;
  c10::optional<at::Tensor> weight;
  LnBackwardArgs a{};
  LnBwdPlan plan;
};

// The checks (devices too) come before the caller's CUDAGuard, which needs x on a CUDA device.
// mean_ null: RMSNorm (its messages say rms_norm, or `op` where given).
LnShape check_backward(const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape, const at::Tensor* mean_,
                       const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_, int64_t version,
                       const char* op = nullptr) {
  if (!op) op = mean_ ? "layer_norm" : "rms_norm";
  const LnShape s = ln_check_backward(dy_, x_, nshape, mean_, rstd_, weight_, /*allow_f64=*/false, version, op);
  TORCH_CHECK(x_.is_cuda(), op, " backward: input must be a CUDA tensor here");
  check_knobs(s.cols, x_.scalar_type() == at::kFloat, /*forward=*/false);
  return s;
}

BwdCall prepare_backward(const LnShape& s, const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape,
                         const at::Tensor& mean_, const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_,
                         std::array<bool, 3> mask, int64_t version, bool rms = false,
                         const at::Tensor* dsum = nullptr) {
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
  if (dsum && mask[0]) {
    c.dsum = dsum->contiguous();
    a.dsum = c.dsum.data_ptr();
  }
  if (s.cols > 0) c.plan = ln_backward_plan(a, int(version), ln_device());
  return c;
}

// The call's workspace, then its launch; nothing where rows have no element (every
// output is empty then).
void run_backward(BwdCall& c) {
  if (c.a.cols == 0) return;
  if (c.plan.workspace_floats > 0) {
    c.ws = at::empty({c.plan.workspace_floats}, c.x.options().dtype(at::kFloat));
    c.a.workspace = c.ws.data_ptr<float>();
  }
  KC_TORCH_CHECK_CUDA(ln_backward(c.a, c.plan, at::cuda::getCurrentCUDAStream()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cuda(
    const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape, const at::Tensor& mean_,
    const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight_, std::array<bool, 3> mask, int64_t version) {
  const LnShape s = check_backward(dy_, x_, nshape, &mean_, rstd_, weight_, version);
  const at::cuda::CUDAGuard guard(x_.device());
  BwdCall c = prepare_backward(s, dy_, x_, nshape, mean_, rstd_, weight_, mask, version);
  run_backward(c);
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
  run_backward(c);
  return {c.dx, c.dw};
}

// add_norm's backward: the norm's backward of the saved sum s with dsum (the
// gradient reaching the sum output; absent: none) added to dx, by the main
// kernel where the plan's family does it (LnBwdPlan::dsum), else after. dx is the
// gradient of both x and the residual.
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_norm_bwd_cuda(
    const at::Tensor& dy, const c10::optional<at::Tensor>& dsum, const at::Tensor& s_, at::IntArrayRef nshape,
    const at::Tensor& mean, const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, bool rms,
    std::array<bool, 3> mask, int64_t version) {
  const char* op = "add_norm";
  const LnShape s = check_backward(dy, s_, nshape, rms ? nullptr : &mean, rstd, weight, version, op);
  TORCH_CHECK(!rms || !mask[2], "add_norm: kind 'rms' has no bias, so no dbias");
  const bool has_ds = dsum.has_value() && dsum->defined();
  if (has_ds) ln_check_same(s_, *dsum, "add_norm backward", "the sum's gradient", "the sum");
  const at::cuda::CUDAGuard guard(s_.device());
  BwdCall c = prepare_backward(s, dy, s_, nshape, rms ? rstd : mean, rstd, weight, mask, version, rms,
                               has_ds ? &*dsum : nullptr);
  run_backward(c);
  // One column (LayerNorm): the norm's dx is exactly 0, as in layer_norm_bwd_cuda.
  if (!rms && s.cols == 1 && mask[0]) {
    if (has_ds) c.dx.copy_(c.dsum);
    else c.dx.zero_();
  }
  return {c.dx, c.dw, c.db};
}

// The private _backward_plan (binding.cpp): the plan of this call, as (name, value) pairs.
std::vector<std::pair<std::string, int64_t>> backward_plan_query(
    const at::Tensor& dy, const at::Tensor& x, at::IntArrayRef nshape, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& weight, std::array<bool, 3> mask, int64_t version,
    const c10::optional<at::Tensor>& dsum, bool rms) {
  const LnShape s = check_backward(dy, x, nshape, rms ? nullptr : &mean, rstd, weight, version);
  TORCH_CHECK(s.cols > 0, "_backward_plan: rows of no element launch nothing");
  const at::cuda::CUDAGuard guard(x.device());
  const bool has_ds = dsum.has_value() && dsum->defined();
  const LnBwdPlan p =
      prepare_backward(s, dy, x, nshape, mean, rstd, weight, mask, version, rms, has_ds ? &*dsum : nullptr).plan;
  const LnDevice d = ln_device();
  return {{"version", p.version},     {"family", p.family},
          {"partials", p.partials},   {"vec", p.vec},
          {"iters", p.iters},         {"tpr", p.tpr},
          {"warp", p.warp},           {"prefetch", p.prefetch},
          {"stages", p.stages},       {"cluster", p.cluster},
          {"slots", p.slots},         {"threads", p.threads},
          {"grid", p.grid},           {"smem", int64_t(p.smem)},
          {"partial_rows", p.partial_rows}, {"workspace_floats", p.workspace_floats},
          {"finalize", p.finalize},   {"dsum", p.dsum},
          {"sms", d.sms},             {"cc", d.cc}};
}

// The private _forward_plan (binding.cpp): the forward plan of this call, as (name, value) pairs.
std::vector<std::pair<std::string, int64_t>> forward_plan_query(
    const at::Tensor& x, at::IntArrayRef nshape, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, int64_t version, const c10::optional<at::Tensor>& residual, bool rms) {
  const bool has_res = residual.has_value() && residual->defined();
  const FwdCall c = prepare_forward(x, nshape, weight, bias, 1e-5, version, rms, has_res ? &*residual : nullptr);
  const at::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(c.a.cols > 0, "_forward_plan: rows of no element launch nothing");
  const LnDevice d = ln_device();
  const LnFwdPlanInfo p = ln_forward_plan(c.a, int(version), d);
  return {{"version", version},     {"family", p.family},     {"vec", p.vec},
          {"iters", p.iters},       {"tpr", p.tpr},           {"warp", p.warp},
          {"stages", p.stages},     {"slots", p.slots},       {"threads", p.threads},
          {"grid", p.grid},         {"cluster", p.cluster},   {"smem", p.smem},
          {"l2pf", p.l2pf},         {"add", p.add},           {"add_first", p.add_first},
          {"pack", p.pack},         {"sms", d.sms},           {"cc", d.cc}};
}

const bool registered = (ln_backward_plan_query() = &backward_plan_query, true);
const bool registered_fwd = (ln_forward_plan_query() = &forward_plan_query, true);

}  // namespace
}  // namespace day26

TORCH_LIBRARY_IMPL(day26, CUDA, m) {
  m.impl("layer_norm_fwd", &day26::layer_norm_fwd_cuda);
  m.impl("layer_norm_bwd", &day26::layer_norm_bwd_cuda);
  m.impl("rms_norm_fwd", &day26::rms_norm_fwd_cuda);
  m.impl("rms_norm_bwd", &day26::rms_norm_bwd_cuda);
  m.impl("add_norm_fwd", &day26::add_norm_fwd_cuda);
  m.impl("add_norm_bwd", &day26::add_norm_bwd_cuda);
}
