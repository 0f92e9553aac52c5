// se_cuda.cpp: CUDA glue of the se_module ops: validate (se_checks.h), pick
// the layout the kernels see, allocate outputs (kc::new_output: NaN-poisoned
// under the tests) and fp32 workspaces, launch on the current stream, and turn a
// launcher's cudaError_t into an exception.
#include <ATen/ATen.h>
#include <optional>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "kc/device.h"
#include "kc/torch_utils.h"
#include "se_checks.h"
#include "se_module.h"

namespace {

// x as the kernels see it: NCHW-dense or NHWC-dense (copied to NCHW if neither).
struct Prepared {
  at::Tensor x;
  se::Dims d;
  at::MemoryFormat fmt;  // of outputs shaped like x
};

Prepared prepare(const at::Tensor& x_) {
  const bool nchw = x_.is_contiguous();
  const bool cl = x_.is_contiguous(at::MemoryFormat::ChannelsLast);
  Prepared p;
  p.x = (nchw || cl) ? x_ : x_.contiguous();
  p.fmt = se_glue::out_format(x_);
  const int64_t L = x_.size(2) * x_.size(3);
  // dense in both layouts only when C == 1 or L == 1 (same bytes); [N, C] rows read best as NHWC
  const bool nhwc = cl && (!nchw || L == 1);
  p.d = se::Dims{x_.size(0), x_.size(1), L, nhwc ? se::Layout::NHWC : se::Layout::NCHW};
  return p;
}

// t (shaped like x) in the layout the kernels use for x
at::Tensor in_layout(const at::Tensor& t, const se::Dims& d) {
  return d.layout == se::Layout::NHWC ? t.contiguous(at::MemoryFormat::ChannelsLast) : t.contiguous();
}

// What the plan needs to know about the current device (kc/device.h reads each attribute once
// per device). A query that fails reads 0: refused here rather than planned on.
se::DeviceInfo device_info() {
  se::DeviceInfo d{kc::device_attr(cudaDevAttrMultiProcessorCount), kc::device_attr(cudaDevAttrComputeCapabilityMajor),
                   kc::smem_optin_bytes()};
  TORCH_CHECK(d.sms > 0 && d.cc_major > 0 && d.smem_optin > 0, "se_module: could not read the CUDA device's attributes");
  return d;
}

int num_sms() { return device_info().sms; }

at::Tensor new_like_x(const Prepared& p, const at::Tensor& x) {
  return kc::new_output(x.sizes(), x.options().memory_format(p.fmt));
}

at::Tensor workspace(int64_t floats, const at::Tensor& like) {
  return kc::new_output({floats > 0 ? floats : 1}, like.options().dtype(at::kFloat));
}

at::Tensor fp32(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() ? t : t.to(at::kFloat).contiguous();
}

// ------------------------------------------------------------------ stages

at::Tensor global_avg_pool_cuda(const at::Tensor& x_, int64_t version) {
  se_glue::check_x(x_);
  se_glue::check_pool_version(version);
  const kc::DType dt = kc::to_kc_dtype(x_, "x");
  const c10::cuda::CUDAGuard guard(x_.device());
  const Prepared p = prepare(x_);
  at::Tensor out = kc::new_output({p.d.n, p.d.c}, x_.options().memory_format(at::MemoryFormat::Contiguous));
  const se::ReducePlan plan = se::plan_reduce(p.d, dt, num_sms());
  at::Tensor part = workspace(version == 2 ? p.d.n * plan.splits * p.d.c : 0, x_);
  KC_TORCH_CHECK_CUDA(se::pool_forward(p.x.const_data_ptr(), dt, p.d, int(version), plan,
                                       part.mutable_data_ptr<float>(), out.mutable_data_ptr(),
                                       at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor global_avg_pool_backward_cuda(const at::Tensor& grad, int64_t H, int64_t W, bool channels_last) {
  TORCH_CHECK(grad.dim() == 2, "grad must be [N, C], got sizes ", kc::fmt(grad.sizes()));
  const kc::DType dt = kc::to_kc_dtype(grad, "grad");
  TORCH_CHECK(H >= 1 && W >= 1, "H and W must be at least 1, got ", kc::fmt(H), " and ", kc::fmt(W));
  const c10::cuda::CUDAGuard guard(grad.device());
  const int64_t N = grad.size(0), C = grad.size(1);
  const at::Tensor g = fp32(grad);
  at::Tensor out = kc::new_output(
      {N, C, H, W},
      grad.options().memory_format(channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous));
  const se::Dims d{N, C, H * W, channels_last ? se::Layout::NHWC : se::Layout::NCHW};
  KC_TORCH_CHECK_CUDA(se::pool_backward(g.const_data_ptr<float>(), 1.f / float(H * W), dt, d, out.mutable_data_ptr(),
                                        num_sms(), at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor pointwise_cuda(const at::Tensor& a_, const at::Tensor* b_, se::Pointwise op, const char* name) {
  const kc::DType dt = kc::to_kc_dtype(a_, name);
  if (b_ != nullptr) {
    TORCH_CHECK(b_->sizes() == a_.sizes() && b_->scalar_type() == a_.scalar_type(), name,
                ": grad and the saved tensor must have the same shape and dtype, got ", kc::fmt(a_.sizes()),
                " ", a_.scalar_type(), " and ", kc::fmt(b_->sizes()), " ", b_->scalar_type());
    se_glue::check_same_device(a_, "grad", *b_, "the saved tensor");
  }
  const c10::cuda::CUDAGuard guard(a_.device());
  const at::Tensor a = a_.contiguous();
  const at::Tensor b = b_ != nullptr ? b_->contiguous() : at::Tensor();
  at::Tensor out = kc::new_output_like(a);
  KC_TORCH_CHECK_CUDA(se::pointwise(op, a.const_data_ptr(), b.defined() ? b.const_data_ptr() : nullptr,
                                    out.mutable_data_ptr(), dt, a.numel(), num_sms(),
                                    at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor swish_cuda(const at::Tensor& x) { return pointwise_cuda(x, nullptr, se::Pointwise::SwishFwd, "x"); }
at::Tensor swish_backward_cuda(const at::Tensor& g, const at::Tensor& x) {
  return pointwise_cuda(g, &x, se::Pointwise::SwishBwd, "grad");
}
at::Tensor sigmoid_cuda(const at::Tensor& x) { return pointwise_cuda(x, nullptr, se::Pointwise::SigmoidFwd, "x"); }
at::Tensor sigmoid_backward_cuda(const at::Tensor& g, const at::Tensor& y) {
  return pointwise_cuda(g, &y, se::Pointwise::SigmoidBwd, "grad");
}

at::Tensor excitation_cuda(const at::Tensor& x_, const at::Tensor& s_) {
  se_glue::check_x(x_);
  se_glue::check_nc(s_, "s", x_);
  const kc::DType dt = kc::to_kc_dtype(x_, "x");
  (void)kc::to_kc_dtype(s_, "s");
  const c10::cuda::CUDAGuard guard(x_.device());
  const Prepared p = prepare(x_);
  const at::Tensor s = fp32(s_);
  at::Tensor out = new_like_x(p, x_);
  KC_TORCH_CHECK_CUDA(se::excitation_forward(p.x.const_data_ptr(), s.const_data_ptr<float>(), out.mutable_data_ptr(),
                                             dt, p.d, num_sms(), at::cuda::getCurrentCUDAStream()));
  return out;
}

std::tuple<at::Tensor, at::Tensor> excitation_backward_cuda(const at::Tensor& grad_, const at::Tensor& x_,
                                                            const at::Tensor& s_) {
  se_glue::check_x(x_);
  se_glue::check_like_x(grad_, "grad", x_);
  se_glue::check_nc(s_, "s", x_);
  const kc::DType dt = kc::to_kc_dtype(x_, "x");
  const kc::DType s_dt = kc::to_kc_dtype(s_, "s");
  const c10::cuda::CUDAGuard guard(x_.device());
  const Prepared p = prepare(x_);
  const at::Tensor g = in_layout(grad_, p.d);
  const at::Tensor s = fp32(s_);
  at::Tensor gx = new_like_x(p, x_);
  at::Tensor gs = kc::new_output({p.d.n, p.d.c}, s_.options().memory_format(at::MemoryFormat::Contiguous));
  const se::ReducePlan plan = se::plan_reduce(p.d, dt, num_sms());
  at::Tensor part = workspace(p.d.n * plan.splits * p.d.c, x_);
  KC_TORCH_CHECK_CUDA(se::excitation_backward(g.const_data_ptr(), p.x.const_data_ptr(), s.const_data_ptr<float>(),
                                              gx.mutable_data_ptr(), gs.mutable_data_ptr(), dt, s_dt, p.d, plan,
                                              part.mutable_data_ptr<float>(), at::cuda::getCurrentCUDAStream()));
  return {gx, gs};
}

// ------------------------------------------------------------------ fused block
// Each call: check, compute its plan once (se_plan.h), allocate the outputs and the
// plan's workspace, launch what the plan says.

struct FusedArgs {
  kc::DType dt;
  int64_t S;
  at::Tensor w1, b1, w2, b2;  // contiguous, in wdt
  kc::DType wdt;              // the parameters' dtype, or fp32 where they were given in mixed dtypes
  se::DeviceInfo dev;         // the current device's
  se::SeParams params() const {
    return {w1.const_data_ptr(), b1.const_data_ptr(), w2.const_data_ptr(), b2.const_data_ptr(), wdt};
  }
};

FusedArgs fused_args(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                     const at::Tensor& b2, int64_t act, int64_t version, int64_t gate, bool backward) {
  se_glue::check_x(x);
  FusedArgs f;
  f.S = se_glue::check_weights(x, w1, b1, w2, b2);
  se_glue::check_activation(act);
  se_glue::check_scale_activation(gate);
  se_glue::check_fused_version(version);
  f.dt = kc::to_kc_dtype(x, "x");
  (void)kc::to_kc_dtype(w1, "w1");
  (void)kc::to_kc_dtype(b1, "b1");
  (void)kc::to_kc_dtype(w2, "w2");
  (void)kc::to_kc_dtype(b2, "b2");
  f.dev = device_info();
  const se::DeviceInfo& info = f.dev;
  const size_t smem = se::fused_mlp_smem_bytes(x.size(1), f.S, backward);
  TORCH_CHECK(smem <= size_t(info.smem_optin), "C + S = ", kc::fmt(x.size(1) + f.S),
              " is too large for the fused kernel's shared memory (", kc::fmt(int64_t(smem)), " bytes needed, ",
              kc::fmt(info.smem_optin), " available); use the staged ops");
  // The kernels take the parameters in their own dtype (one for all four); mixed dtypes are widened here.
  const bool one_dtype = w1.scalar_type() == b1.scalar_type() && w1.scalar_type() == w2.scalar_type() &&
                         w1.scalar_type() == b2.scalar_type();
  auto prep = [&](const at::Tensor& t) { return one_dtype ? t.contiguous() : fp32(t); };
  f.w1 = prep(w1);
  f.b1 = prep(b1);
  f.w2 = prep(w2);
  f.b2 = prep(b2);
  f.wdt = kc::to_kc_dtype(f.w1, "w1");
  return f;
}

// What the plan reads of a call: the shape, dtypes, version, device and the addresses
// of the tensors the kernels touch (out: the forward's output or the backward's dx).
se::PlanInputs plan_inputs(const Prepared& p, const FusedArgs& f, int64_t version, const void* g, const void* out,
                           bool state) {
  se::PlanInputs in;
  in.d = p.d;
  in.S = f.S;
  in.dt = f.dt;
  in.wdt = f.wdt;
  in.version = version;
  in.dev = f.dev;
  in.x = p.x.const_data_ptr();
  in.g = g;
  in.out = out;
  in.w1 = f.w1.const_data_ptr();
  in.b1 = f.b1.const_data_ptr();
  in.w2 = f.w2.const_data_ptr();
  in.b2 = f.b2.const_data_ptr();
  in.state = state;
  in.capacity = &se::cluster_capacity;
  return in;
}

// The forward; with `state` (se_block_train) also the values that the backward reads
// (se_module.h, "The saved state"): allocated [N, 3 C + 2 S] always, written where the
// plan keeps them.
at::Tensor forward_impl(const at::Tensor& x_, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                        const at::Tensor& b2, int64_t act, int64_t version, int64_t gate, at::Tensor* state) {
  const c10::cuda::CUDAGuard guard(x_.device());
  const FusedArgs f = fused_args(x_, w1, b1, w2, b2, act, version, gate, false);  // checks x too
  const Prepared p = prepare(x_);
  if (state != nullptr) {
    *state = kc::new_output({p.d.n, se_glue::state_cols(p.d.c, f.S)}, x_.options().dtype(at::kFloat));
  }
  if (p.d.n == 0) return new_like_x(p, x_);
  at::Tensor out = new_like_x(p, x_);
  const se::SePlan plan =
      se::plan_forward(plan_inputs(p, f, version, nullptr, out.const_data_ptr(), state != nullptr));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (plan.path == se::Path::Cluster) {
    KC_TORCH_CHECK_CUDA(se::cluster_forward(p.x.const_data_ptr(), f.dt, p.d, f.S, se::Act(act), se::Gate(gate),
                                            f.params(), out.mutable_data_ptr(), plan.cluster, stream));
    return out;
  }
  at::Tensor ws = workspace(plan.workspace, x_);
  KC_TORCH_CHECK_CUDA(se::se_forward(p.x.const_data_ptr(), f.dt, p.d, f.S, se::Act(act), se::Gate(gate), f.params(),
                                     out.mutable_data_ptr(), ws.mutable_data_ptr<float>(),
                                     state != nullptr ? state->mutable_data_ptr<float>() : nullptr, plan, stream));
  return out;
}

at::Tensor se_block_cuda(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                         const at::Tensor& b2, int64_t act, int64_t version, int64_t gate) {
  return forward_impl(x, w1, b1, w2, b2, act, version, gate, nullptr);
}

std::tuple<at::Tensor, at::Tensor> se_block_train_cuda(const at::Tensor& x, const at::Tensor& w1,
                                                       const at::Tensor& b1, const at::Tensor& w2,
                                                       const at::Tensor& b2, int64_t act, int64_t version,
                                                       int64_t gate) {
  at::Tensor state;
  at::Tensor out = forward_impl(x, w1, b1, w2, b2, act, version, gate, &state);
  return {out, state};
}

// A weight gradient as the kernels wrote it (in f.wdt), in the weight's dtype and shape.
at::Tensor as_weight(const at::Tensor& d, const at::Tensor& w) {
  return d.scalar_type() == w.scalar_type() ? d : d.to(w.scalar_type()).view(w.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> se_block_backward_cuda(
    const at::Tensor& grad_, const at::Tensor& x_, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
    const at::Tensor& b2, int64_t act, int64_t version, int64_t gate, const std::optional<at::Tensor>& state) {
  // x's device is current before fused_args reads the device's attributes for the plan
  // (a CPU x gets fused_args' own error rather than the guard's).
  const c10::cuda::OptionalCUDAGuard guard(x_.is_cuda() ? std::optional<c10::Device>(x_.device()) : std::nullopt);
  const FusedArgs f = fused_args(x_, w1, b1, w2, b2, act, version, gate, true);  // checks x (before grad against it)
  se_glue::check_like_x(grad_, "grad", x_);
  if (state.has_value()) se_glue::check_state(*state, x_, f.S);
  const Prepared p = prepare(x_);
  const int64_t S = f.S;
  // Weight gradients in the dtype the kernels write (the parameters' own, unless
  // they came in mixed dtypes), allocated in the weights' own shapes ([S, C] or the
  // conv's [S, C, 1, 1]: the same contiguous bytes), so they need no view afterwards.
  const auto go = x_.options().dtype(f.w1.scalar_type()).memory_format(at::MemoryFormat::Contiguous);
  auto wgrad = [&](const at::Tensor& w) { return kc::new_output(w.sizes(), go); };
  at::Tensor dx = new_like_x(p, x_);
  at::Tensor dw1 = wgrad(w1), db1 = wgrad(b1), dw2 = wgrad(w2), db2 = wgrad(b2);
  if (p.d.n == 0) {
    dw1.zero_(), db1.zero_(), dw2.zero_(), db2.zero_();
    return {dx, as_weight(dw1, w1), as_weight(db1, b1), as_weight(dw2, w2), as_weight(db2, b2)};
  }
  const at::Tensor g = in_layout(grad_, p.d);
  const se::SePlan plan =
      se::plan_backward(plan_inputs(p, f, version, g.const_data_ptr(), dx.const_data_ptr(), state.has_value()));
  const se::SeParamGrads dw{dw1.mutable_data_ptr(), db1.mutable_data_ptr(), dw2.mutable_data_ptr(),
                            db2.mutable_data_ptr()};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor ws = workspace(plan.workspace, x_);
  if (plan.path == se::Path::Cluster) {
    KC_TORCH_CHECK_CUDA(se::cluster_backward(g.const_data_ptr(), p.x.const_data_ptr(), f.dt, p.d, S, se::Act(act),
                                             se::Gate(gate), f.params(), dx.mutable_data_ptr(), dw,
                                             ws.mutable_data_ptr<float>(), plan.cluster, stream));
  } else {
    KC_TORCH_CHECK_CUDA(se::se_backward(g.const_data_ptr(), p.x.const_data_ptr(), f.dt, p.d, S, se::Act(act),
                                        se::Gate(gate), f.params(), dx.mutable_data_ptr(), dw,
                                        ws.mutable_data_ptr<float>(),
                                        plan.use_state ? state->const_data_ptr<float>() : nullptr, plan, stream));
  }
  return {dx, as_weight(dw1, w1), as_weight(db1, b1), as_weight(dw2, w2), as_weight(db2, b2)};
}

}  // namespace

TORCH_LIBRARY_IMPL(se_module, CUDA, m) {
  m.impl("global_avg_pool", &global_avg_pool_cuda);
  m.impl("global_avg_pool_backward", &global_avg_pool_backward_cuda);
  m.impl("swish", &swish_cuda);
  m.impl("swish_backward", &swish_backward_cuda);
  m.impl("sigmoid", &sigmoid_cuda);
  m.impl("sigmoid_backward", &sigmoid_backward_cuda);
  m.impl("excitation", &excitation_cuda);
  m.impl("excitation_backward", &excitation_backward_cuda);
  m.impl("se_block", &se_block_cuda);
  m.impl("se_block_train", &se_block_train_cuda);
  m.impl("se_block_backward", &se_block_backward_cuda);
}
