// CUDA glue of the day-50 ops: validation, backend choice, layout handling,
// workspaces, launch on the current stream. Kernels live in naive.cu and
// flash_*.cu and know nothing of torch.
//
// Layouts: the naive kernels read q, k, v, dout through their strides as they
// are. The fused kernels read them by strides too (a (B, N, H, d).transpose(1, 2)
// view works without a copy) as long as the innermost stride is 1, the other
// strides are multiples of 8 and the data is 16-byte aligned; anything else is
// copied to a contiguous tensor first (bench.py measures both).
//
// Grouped-query attention (k, v with Hk < H heads, check_qkv): every kernel maps
// q head h to kv head h / (H / Hk); dk and dv come back in k's and v's shapes.
//
// Windows and softcaps (attention_math.h) run in both versions of the tensor-core kernels.
// Inputs no fused kernel takes run the reference math (attention_cpu.cpp) on the GPU for them.
// Packed sequences (attention_varlen): the tensor-core kernels (either version) without a host
// sync, else the reference after reading the offsets.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <limits>

#include "attention.h"
#include "attention_knobs.h"
#include "attention_checks.h"
#include "attention_math.h"
#include "kc/torch_utils.h"

namespace {

using at::Tensor;
using day50::Backend;
using day50::View4;

View4 view4(const Tensor& t) {
  View4 v;
  v.ptr = t.data_ptr();
  v.sb = t.stride(0);
  v.sh = t.stride(1);
  v.sr = t.stride(2);
  v.sc = t.stride(3);
  return v;
}

day50::NaiveType naive_type(const Tensor& t) {
  if (t.scalar_type() == at::kDouble) return day50::NaiveType::F64;
  return day50::naive_type(kc::to_kc_dtype(t, "q"));
}

// Why the fused kernels cannot run these inputs (nullptr: they can).
const char* fused_unsupported(const Tensor& q) {
  if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16)
    return "needs float16 or bfloat16 inputs";
  if (q.size(3) % 8 != 0 || q.size(3) > day50::kFusedMaxHeadDim)
    return "needs a head dim that is a multiple of 8 and at most 128";
  return nullptr;
}

bool choose_fused(Backend backend, const Tensor& q) {
  const char* why = fused_unsupported(q);
  if (backend == Backend::Fused) {
    TORCH_CHECK(why == nullptr, "attention: backend=\"fused\" ", why, " (got ", q.scalar_type(), ", head dim ",
                kc::fmt(q.size(3)), "); use backend=\"naive\" or \"auto\"");
    return true;
  }
  return backend == Backend::Auto && why == nullptr;
}

// fp16 / bf16 dense attention at a head dim over 128 (a multiple of 8, at most
// kHopperFwdMaxHeadDim), windows and softcaps included: "auto" runs the forward on the Hopper
// kernel (version 2) where the GPU and the build have it and no version-1 pin says otherwise;
// elsewhere the SIMT kernels (the backward: wide_fused_backward).
bool wide_hopper_forward(Backend backend, const Tensor& q) {
  const int64_t d = q.size(3);
  return backend == Backend::Auto && q.numel() > 0 &&  // empty: SIMT (no grid to launch)
         (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) &&
         d > day50::kFusedMaxHeadDim && d <= day50::kHopperFwdMaxHeadDim && d % 8 == 0 &&
         day50::fused_fwd_version() != 1;
}

// The backward of fp16 / bf16 at a head dim over 128 (a multiple of 8, at most
// kFusedBwdMaxHeadDim) under "auto", windows and softcaps included: whether the fused kernels
// run it (wide_backward_fused says).
bool wide_backward(Backend backend, const Tensor& q) {
  const int64_t d = q.size(3);
  return backend == Backend::Auto &&
         (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) && d > day50::kFusedMaxHeadDim &&
         d <= day50::kFusedBwdMaxHeadDim && d % 8 == 0;
}

// p's backward at a head dim over 128 runs fused: on version 2's d 256 kernel where it runs
// (deterministic too) and no version-1 pin says otherwise; else on version 1's main kernel in
// column halves where the GPU gives a block its shared memory and no version-2 pin says
// otherwise, but not for deterministic=True (its dq adds are unordered). Elsewhere the SIMT kernels.
bool wide_backward_fused(const day50::FusedParams& p, bool deterministic) {
  if (p.bwd_version != 1 && day50::hopper_backward_applies(p)) return true;
  return !deterministic && p.bwd_version != 2 && day50::fused_backward_wide_fits();
}

// Why the SIMT kernels (flash_simt.cu) cannot run these inputs (nullptr: they can).
const char* simt_unsupported(const Tensor& q) {
  if (q.scalar_type() == at::kDouble) return "takes float32, float16 or bfloat16 inputs, not float64";
  if (q.size(3) > day50::kSimtMaxHeadDim) return "needs a head dim of at most 256";
  return nullptr;
}

// Where the tensor-core kernels do not run (why_not_fused says why): backend="simt" asks for
// the SIMT kernels by name; "auto" takes them where they apply, so that no input people train
// with reaches the naive path's N x N workspaces. fp16/bf16 on CUDA cores is a slow path, and
// the naive fallback (d > 256) an O(N^2)-memory one: both are said once, never silent.
bool choose_simt(Backend backend, const Tensor& q, const char* why_not_fused) {
  const char* why = simt_unsupported(q);
  if (backend == Backend::Simt) {
    TORCH_CHECK(why == nullptr, "attention: backend=\"simt\" ", why, " (got ", q.scalar_type(), ", head dim ",
                kc::fmt(q.size(3)), "); use backend=\"naive\" or \"auto\"");
    return true;
  }
  if (backend != Backend::Auto) return false;
  if (why != nullptr) {
    if (q.scalar_type() != at::kDouble)
      TORCH_WARN_ONCE("attention: q ", kc::fmt(q.sizes()), " (", q.scalar_type(), ") runs the naive path with N x N "
                      "workspaces: the fused kernels need a head dim of at most 256");
    return false;
  }
  if (q.scalar_type() != at::kFloat)
    TORCH_WARN_ONCE("attention: q ", kc::fmt(q.sizes()), " (", q.scalar_type(), ") runs the fused kernels on CUDA "
                    "cores (backend=\"simt\"), several times slower than on tensor cores, which ", why_not_fused);
  return true;
}

// The tensor itself when the fused kernels can read it by strides, else a
// contiguous copy (fresh allocations are 16-byte aligned).
Tensor fused_ready(const Tensor& t) {
  if (day50::fused_layout_ok(view4(t))) return t;
  return t.is_contiguous() ? t.clone() : t.contiguous();
}

day50::FusedParams fused_params(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  day50::FusedParams p;
  p.q = view4(q);
  p.k = view4(k);
  p.v = view4(v);
  p.B = q.size(0);
  p.H = q.size(1);
  p.Hk = k.size(1);
  p.Nq = q.size(2);
  p.Nk = k.size(2);
  p.d = q.size(3);
  p.scale = float(scale);
  p.causal = causal;
  p.dtype = kc::to_kc_dtype(q, "q");
  p.window_right = causal ? 0 : -1;  // attention.h: causal folded into the window
  p.row_sb = p.H * p.Nq;             // lse, grad_lse, dsum, dq_accum: contiguous (B, H, Nq[, d])
  p.row_sh = p.Nq;
  p.dk_sb = p.Hk * p.Nk * p.d;       // dk, dv: contiguous (B, Hk, Nk, d)
  p.dk_sh = p.Nk * p.d;
  p.dk_sr = p.d;
  return p;
}

// Dense masking as attention.h's FusedParams wants it: causal is a window's right edge on the
// diagonal, so a window (-1, 0) runs as plain causal (the Hopper kernels take it).
void set_masking(day50::FusedParams& p, const day50::Window& w, double softcap) {
  p.window_left = w.left;
  p.window_right = w.right;
  p.causal = w.right == 0;
  p.bottom_right = w.bottom_right;
  p.softcap = float(softcap);
}

// A packed (total, heads, d) tensor as the fused kernels' View4 (attention.h: sb = 0).
View4 view3(const Tensor& t) {
  View4 v;
  v.ptr = t.data_ptr();
  v.sb = 0;
  v.sh = t.stride(1);
  v.sr = t.stride(0);
  v.sc = t.stride(2);
  return v;
}

Tensor fused_ready3(const Tensor& t) {
  if (day50::fused_layout_ok(view3(t))) return t;
  return t.is_contiguous() ? t.clone() : t.contiguous();
}

// Packed sequences: B = cu.size(0) - 1 sequences, Nq / Nk the max lengths (they size the grid),
// row arrays (lse, dsum, dq_accum) in the (H, total_q) layout, dk / dv (total_k, Hk, d).
day50::FusedParams varlen_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                                 const Tensor& cu_k, int64_t max_q, int64_t max_k, double scale,
                                 const day50::Window& w, double softcap) {
  day50::FusedParams p;
  p.q = view3(q);
  p.k = view3(k);
  p.v = view3(v);
  p.B = cu_q.size(0) - 1;
  p.H = q.size(1);
  p.Hk = k.size(1);
  p.Nq = max_q;
  p.Nk = max_k;
  p.d = q.size(2);
  p.scale = float(scale);
  p.dtype = kc::to_kc_dtype(q, "q");
  set_masking(p, w, softcap);
  p.cu_seqlens_q = cu_q.data_ptr<int>();
  p.cu_seqlens_k = cu_k.data_ptr<int>();
  p.row_sb = 0;
  p.row_sh = q.size(0);
  p.total_q = q.size(0);
  p.total_k = k.size(0);
  p.dk_sb = 0;
  p.dk_sh = p.d;
  p.dk_sr = p.Hk * p.d;
  p.fwd_version = day50::fused_fwd_version();  // 0 (auto) unless a benchmark or test pinned one
  p.bwd_version = day50::fused_bwd_version();
  return p;
}


std::tuple<Tensor, Tensor> attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  std::optional<double> scale_opt, c10::string_view backend_s,
                                                  bool /*deterministic: the forward has no atomics*/,
                                                  at::IntArrayRef window, double softcap) {
  const Backend backend = day50::parse_backend(std::string(backend_s));
  const double scale = day50::check_qkv(q, k, v, scale_opt);
  const day50::Window w = day50::make_window(window, causal, false, "attention");
  day50::check_softcap(softcap, "attention");
  const bool masked = w.left >= 0 || w.right > 0 || softcap > 0;  // more than plain causal
  causal = w.right == 0;  // a window (-1, 0) is plain causal, for every path below
  const c10::cuda::CUDAGuard guard(q.device());
  if (day50::no_keys(k)) return day50::no_keys_forward(q);
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), Nk = k.size(2), d = q.size(3);
  Tensor lse = kc::new_output({B, H, Nq}, q.options().dtype(day50::lse_dtype(q.scalar_type())));
  Tensor out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // the kernels' parameters, out (in q's layout) and lse included
  auto params = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
    day50::FusedParams p = fused_params(qq, kk, vv, causal, scale);
    set_masking(p, w, softcap);
    out = day50::new_output_in_layout_of(q, {B, H, Nq, d}, q.options());
    p.o = out.data_ptr();
    p.o_sb = out.stride(0);
    p.o_sh = out.stride(1);
    p.o_sr = out.stride(2);
    p.lse = lse.data_ptr<float>();
    return p;
  };
  const bool fused = choose_fused(backend, q);
  if (!fused && wide_hopper_forward(backend, q)) {
    day50::FusedParams p = params(fused_ready(q), fused_ready(k), fused_ready(v));
    const cudaError_t e = day50::hopper_attention_forward(p, stream);
    if (e != cudaErrorNotSupported) {  // not supported here (GPU, build, a layout): SIMT below
      KC_TORCH_CHECK_CUDA(e);
      return {out, lse};
    }
  }
  if (fused) {
    day50::FusedParams p = params(fused_ready(q), fused_ready(k), fused_ready(v));
    p.fwd_version = day50::fused_fwd_version();  // 0 (auto) unless a benchmark or test pinned one
    KC_TORCH_CHECK_CUDA(day50::fused_attention_forward(p, stream));
  } else if (choose_simt(backend, q, fused_unsupported(q))) {  // any strides: no copies
    day50::FusedParams p = params(q, k, v);
    KC_TORCH_CHECK_CUDA(day50::simt_attention_forward(p, stream));
  } else if (masked) {  // the reference math on the GPU (N x N scores)
    std::tie(out, lse) = day50::reference_forward(q, k, v, scale, w, softcap);
  } else {  // the naive kernels write contiguous: copied into q's layout when that differs
    out = day50::new_output_in_layout_of(q, {B, H, Nq, d}, q.options());
    Tensor o = out.is_contiguous() ? out : at::empty({B, H, Nq, d}, q.options());
    Tensor ws = at::empty({B * H * Nq * Nk}, q.options().dtype(lse.scalar_type()));
    KC_TORCH_CHECK_CUDA(day50::naive_attention_forward(view4(q), view4(k), view4(v), o.data_ptr(),
                                                       lse.data_ptr(), ws.data_ptr(), B, H, k.size(1), Nq, Nk, d,
                                                       causal, scale, naive_type(q), stream));
    if (!o.is_same(out)) out.copy_(o);
  }
  return {out, lse};
}

// The dense backward's parameters, the same for the tensor-core and SIMT families: inputs as
// the family reads them, the outputs dq (q's layout), dk and dv (one layout: dk's strides),
// lse and grad_lse.
day50::FusedParams backward_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                                   const Tensor& out, const Tensor& lse, const Tensor& grad_lse, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, bool causal, double scale,
                                   const day50::Window& w, double softcap) {
  day50::FusedParams p = fused_params(q, k, v, causal, scale);
  set_masking(p, w, softcap);
  p.out = view4(out);
  p.dout = view4(grad_out);
  p.lse = const_cast<float*>(lse.data_ptr<float>());
  p.grad_lse = grad_lse.defined() ? grad_lse.data_ptr<float>() : nullptr;
  p.dq = dq.data_ptr();
  p.dq_sb = dq.stride(0);
  p.dq_sh = dq.stride(1);
  p.dq_sr = dq.stride(2);
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dk_sb = dk.stride(0);
  p.dk_sh = dk.stride(1);
  p.dk_sr = dk.stride(2);
  return p;
}

// The kernels write dk and dv with one set of strides (dk's). dv comes back in v's layout;
// where that differs from k's (rare: k and v laid out differently), they write a buffer in
// dk's layout and dv is copied from it.
Tensor dv_buffer(const Tensor& dk, const Tensor& dv) {
  return dv.strides() == dk.strides() ? dv : at::empty_strided(dk.sizes(), dk.strides(), dv.options());
}

// Where a kernel writes gradient g (attention_checks.h, GradDtypes): g itself if the kernel
// stores g's dtype (t, the inputs' dtype; float32 where `f32`: the fused post-kernel stores it),
// else a t buffer in g's layout that copy_back converts into g.
Tensor grad_target(const Tensor& g, at::ScalarType t, bool f32) {
  if (g.scalar_type() == t || (f32 && g.scalar_type() == at::kFloat)) return g;
  return at::empty_strided(g.sizes(), g.strides(), g.options().dtype(t));
}

// p's gradient outputs: the targets (the strides p already holds), float32 where one is.
void set_grad_targets(day50::FusedParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv, at::ScalarType t) {
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dq_f32 = dq.scalar_type() != t;
  p.dk_f32 = dk.scalar_type() != t;
  p.dv_f32 = dv.scalar_type() != t;
}

std::tuple<Tensor, Tensor, Tensor> copy_back(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqw,
                                             const Tensor& dkw, const Tensor& dvw) {
  const std::pair<Tensor, Tensor> written[] = {{dq, dqw}, {dk, dkw}, {dv, dvw}};
  for (const auto& [o, w] : written)
    if (!w.is_same(o)) o.copy_(w);
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> attention_backward_cuda(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                           const Tensor& v, const Tensor& out, const Tensor& lse_,
                                                           const std::optional<Tensor>& grad_lse_, bool causal,
                                                           std::optional<double> scale_opt,
                                                           c10::string_view backend_s, bool deterministic,
                                                           at::IntArrayRef window, double softcap,
                                                           std::optional<at::ScalarType> dq_dtype,
                                                           std::optional<at::ScalarType> dk_dtype,
                                                           std::optional<at::ScalarType> dv_dtype) {
  const Backend backend = day50::parse_backend(std::string(backend_s));
  const double scale = day50::check_qkv(q, k, v, scale_opt);
  day50::check_backward_args(grad_out, q, out, lse_, grad_lse_);
  const day50::GradDtypes gd = day50::grad_dtypes(q, k, v, dq_dtype, dk_dtype, dv_dtype, "attention_backward");
  const day50::Window w = day50::make_window(window, causal, false, "attention_backward");
  day50::check_softcap(softcap, "attention_backward");
  const bool masked = w.left >= 0 || w.right > 0 || softcap > 0;  // more than plain causal
  causal = w.right == 0;  // a window (-1, 0) is plain causal, for every path below
  const c10::cuda::CUDAGuard guard(q.device());
  if (day50::no_keys(k)) return day50::no_keys_backward(q, k, v, gd);
  const int64_t B = q.size(0), H = q.size(1), Hk = k.size(1), Nq = q.size(2), Nk = k.size(2), d = q.size(3);
  const Tensor lse = lse_.contiguous();
  const Tensor grad_lse = grad_lse_.has_value() ? grad_lse_->contiguous() : Tensor();
  bool fused = choose_fused(backend, q);
  const bool wide = !fused && wide_backward(backend, q);
  if ((fused && deterministic) || wide) {
    day50::FusedParams probe = fused_params(q, k, v, causal, scale);
    set_masking(probe, w, softcap);
    probe.bwd_version = day50::fused_bwd_version();
    if (wide) {
      fused = wide_backward_fused(probe, deterministic);
    } else {
      // Only version 2's main kernel orders its dq adds; elsewhere the SIMT kernels (no atomics)
      const bool v2 = probe.bwd_version != 1 && day50::hopper_backward_applies(probe);
      TORCH_CHECK(v2 || backend != Backend::Fused,
                  "attention_backward: deterministic=True with backend=\"fused\" needs the Hopper kernel "
                  "(compute capability 9.0, an sm_90a build); use backend=\"auto\" or \"simt\" (the SIMT "
                  "kernels, which have no atomics)");
      fused = v2;
    }
  }
  // why the tensor-core kernels do not run (the SIMT warning says it): d <= 128 or a head dim
  // over 128 with deterministic=True, only as the Hopper kernel is missing; otherwise the head dim
  const char* why_not_fused = fused_unsupported(q);
  if (why_not_fused == nullptr || (wide && deterministic))
    why_not_fused = "order their dq adds only in the Hopper backward (deterministic=True)";
  const bool simt = !fused && choose_simt(backend, q, why_not_fused);
  Tensor dq = day50::new_output_in_layout_of(q, {B, H, Nq, d}, q.options().dtype(gd.q));
  // dk and dv in k's and v's layouts, as dq in q's: for k, v sliced from a fused projection
  // as (B, N, H, d) views, the gradients reshape back without a copy (SDPA's rule too)
  Tensor dk = day50::new_output_in_layout_of(k, {B, Hk, Nk, d}, q.options().dtype(gd.k));
  Tensor dv = day50::new_output_in_layout_of(v, {B, Hk, Nk, d}, q.options().dtype(gd.v));
  const at::ScalarType t = q.scalar_type();
  Tensor dqw = dq, dkw = dk, dvw = fused || simt ? dv_buffer(dk, dv) : dv;  // what the kernels write
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (fused) {
    const Tensor qq = fused_ready(q), kk = fused_ready(k), vv = fused_ready(v), go = fused_ready(grad_out);
    day50::FusedParams p = backward_params(qq, kk, vv, go, out, lse, grad_lse, dq, dk, dvw, causal, scale, w, softcap);
    // Workspaces: O(B H N d), never N x N.
    Tensor dsum = at::empty({B * H * Nq}, q.options().dtype(at::kFloat));
    Tensor dq_accum = at::empty({B * H * Nq * d}, q.options().dtype(at::kFloat));
    p.dsum = dsum.data_ptr<float>();
    p.dq_accum = dq_accum.data_ptr<float>();
    p.bwd_version = day50::fused_bwd_version();  // 0 (auto) unless a benchmark or test pinned one
    Tensor dq_sem;  // deterministic: one counter per (q head, query tile)
    if (deterministic) {
      p.deterministic = true;
      dq_sem = at::empty({B * H * day50::hopper_bwd_query_tiles(Nq)}, q.options().dtype(at::kInt));
      p.dq_sem = dq_sem.data_ptr<int>();
      p.dq_sem_ints = dq_sem.numel();  // zeroed by the pre-kernel
    }
    // Grouped-query attention: how the group's dk, dv are summed (flash_bwd.cu); an
    // fp32 workspace of partial sums only when the group is split over CTAs.
    const day50::FusedBwdPlan plan = day50::fused_backward_plan(p);
    Tensor dkv_partial;
    p.heads_per_cta = plan.heads_per_cta;
    if (plan.partial_floats > 0) {
      dkv_partial = at::empty({plan.partial_floats}, q.options().dtype(at::kFloat));
      p.dkv_partial = dkv_partial.data_ptr<float>();
    }
    p.dkv_zero_floats = plan.accum_floats;  // version 2 adds into it: the pre-kernel zeroes it
    // The post-kernel stores dq, and dk, dv where it sums a group's partials: float32 there directly
    const bool kv_post = p.H != p.Hk && plan.partial_floats > 0;
    dqw = grad_target(dq, t, true);
    dkw = grad_target(dk, t, kv_post);
    dvw = grad_target(dvw, t, kv_post);
    set_grad_targets(p, dqw, dkw, dvw, t);
    KC_TORCH_CHECK_CUDA(day50::fused_attention_backward(p, stream));
  } else if (simt) {  // any strides: no copies; workspace: D, one float a query row
    dqw = grad_target(dq, t, false);
    dkw = grad_target(dk, t, false);
    dvw = grad_target(dvw, t, false);
    day50::FusedParams p =
        backward_params(q, k, v, grad_out, out, lse, grad_lse, dqw, dkw, dvw, causal, scale, w, softcap);
    Tensor dsum = at::empty({B * H * Nq}, q.options().dtype(at::kFloat));
    p.dsum = dsum.data_ptr<float>();
    KC_TORCH_CHECK_CUDA(day50::simt_attention_backward(p, stream));
  } else if (masked) {  // the reference math on the GPU (N x N scores)
    return day50::to_grad_dtypes(day50::reference_backward(grad_out, q, k, v, out, lse, grad_lse_, scale, w, softcap),
                                 gd);
  } else {
    const auto acc = day50::lse_dtype(t);
    Tensor ws_p = at::empty({B * H * Nq * Nk}, q.options().dtype(acc));
    Tensor ws_dp = at::empty({B * H * Nq * Nk}, q.options().dtype(acc));
    auto dense = [t](const Tensor& g) {  // naive writes contiguous, in the inputs' dtype
      return g.is_contiguous() && g.scalar_type() == t ? g : at::empty(g.sizes(), g.options().dtype(t));
    };
    dqw = dense(dq);
    dkw = dense(dk);
    dvw = dense(dv);
    KC_TORCH_CHECK_CUDA(day50::naive_attention_backward(
        view4(grad_out), view4(q), view4(k), view4(v), lse.data_ptr(),
        grad_lse.defined() ? grad_lse.data_ptr() : nullptr, dqw.data_ptr(), dkw.data_ptr(), dvw.data_ptr(),
        ws_p.data_ptr(), ws_dp.data_ptr(), B, H, Hk, Nq, Nk, d, causal, scale, naive_type(q), stream));
  }
  return copy_back(dq, dk, dv, dqw, dkw, dvw);
}

// Packed sequences on CUDA: the fused tensor-core kernels for fp16 / bf16 with a head dim they
// take, the offsets read only on the device (no host sync, CUDA-graph capturable); the backward
// with deterministic=True only where version 2 runs it (its dq adds ordered; the forward has no
// atomics). Head dims over 128 (multiples of 8 up to 256) as for dense attention: the forward
// where version 2 runs, the backward on version 1's column halves (not deterministic).
// Otherwise the SIMT kernels (varlen_simt) or the reference math per sequence
// (attention_cpu.cpp), which reads the offsets on the host.
bool varlen_fused(const Tensor& q) {
  return (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) && q.size(2) % 8 == 0 &&
         q.size(2) <= day50::kFusedMaxHeadDim;
}
bool varlen_wide(const Tensor& q) {
  return (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) && q.size(2) % 8 == 0 &&
         q.size(2) > day50::kFusedMaxHeadDim && q.size(2) <= day50::kHopperFwdMaxHeadDim;
}
// deterministic=True: whether version 2, which orders its dq adds, runs p's backward
bool varlen_orders_dq(const day50::FusedParams& p) {
  return p.bwd_version != 1 && day50::hopper_backward_applies(p);
}

// Where the fused kernels do not run packed sequences (float32, head dims they refuse, a
// deterministic backward off Hopper): the SIMT kernels up to d = 256 (O(N) memory, no atomics;
// fp16 / bf16 there warned once, as the dense path does). float64 and larger head dims run the
// reference sequence by sequence.
bool varlen_simt(const Tensor& q, bool deterministic, bool fused) {
  if (fused || q.scalar_type() == at::kDouble || q.size(2) > day50::kSimtMaxHeadDim)
    return false;
  if (q.scalar_type() != at::kFloat)
    TORCH_WARN_ONCE("attention_varlen: q ", kc::fmt(q.sizes()), " (", q.scalar_type(), ") runs the fused kernels "
                    "on CUDA cores (",
                    deterministic ? "deterministic=True off Hopper"
                                  : "a head dim or a GPU the tensor-core kernels do not take",
                    "), several times slower than on tensor cores");
  return true;
}

std::tuple<Tensor, Tensor> attention_varlen_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                                                         int64_t max_k, bool causal, std::optional<double> scale_opt,
                                                         at::IntArrayRef window, double softcap, bool deterministic) {
  const char* op = "attention_varlen";
  const double scale = day50::check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale_opt, op);
  const day50::Window w = day50::make_window(window, causal, true, op);
  day50::check_softcap(softcap, op);
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor cq = cu_q.contiguous(), ck = cu_k.contiguous();
  bool fused = varlen_fused(q);  // deterministic=True or not: the forward has no atomics
  if (varlen_wide(q) && day50::fused_fwd_version() != 1)  // over d 128: version 2 alone
    fused = day50::hopper_forward_applies(varlen_params(q, k, v, cq, ck, max_q, max_k, scale, w, softcap));
  const bool simt = varlen_simt(q, false, fused);
  if (!simt && !fused)
    return day50::reference_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, w, softcap);
  const int64_t H = q.size(1), total_q = q.size(0);
  Tensor out = kc::new_output(q.sizes(), q.options());
  Tensor lse = kc::new_output({H, total_q}, q.options().dtype(at::kFloat));
  if (total_q == 0 || cu_q.size(0) == 1) return {out, lse};
  KC_TORCH_CHECK_CUDA(day50::varlen_offsets_check(cq.data_ptr<int>(), ck.data_ptr<int>(), cq.size(0) - 1, q.size(0),
                                                  k.size(0), max_q, max_k, c10::cuda::getCurrentCUDAStream()));
  if (max_k == 0 || max_q == 0) {  // no sequence has a key (or a query): every row sees nothing
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  const Tensor qq = simt ? q : fused_ready3(q), kk = simt ? k : fused_ready3(k), vv = simt ? v : fused_ready3(v);
  day50::FusedParams p = varlen_params(qq, kk, vv, cq, ck, max_q, max_k, scale, w, softcap);
  p.o = out.data_ptr();
  p.o_sb = 0;
  p.o_sh = out.stride(1);
  p.o_sr = out.stride(0);
  p.lse = lse.data_ptr<float>();
  if (simt) {  // any strides: no copies
    KC_TORCH_CHECK_CUDA(day50::simt_attention_forward(p, c10::cuda::getCurrentCUDAStream()));
    return {out, lse};
  }
  KC_TORCH_CHECK_CUDA(day50::fused_attention_forward(p, c10::cuda::getCurrentCUDAStream()));
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> attention_varlen_backward_cuda(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse_,
    const std::optional<Tensor>& grad_lse_, const Tensor& cu_q, const Tensor& cu_k, int64_t max_q, int64_t max_k,
    bool causal, std::optional<double> scale_opt, at::IntArrayRef window, double softcap, bool deterministic,
    std::optional<at::ScalarType> dq_dtype, std::optional<at::ScalarType> dk_dtype,
    std::optional<at::ScalarType> dv_dtype) {
  const char* op = "attention_varlen_backward";
  const double scale = day50::check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale_opt, op);
  day50::check_varlen_backward(grad_out, q, out, lse_, grad_lse_);
  const day50::GradDtypes gd = day50::grad_dtypes(q, k, v, dq_dtype, dk_dtype, dv_dtype, op);
  const day50::Window w = day50::make_window(window, causal, true, op);
  day50::check_softcap(softcap, op);
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor cq = cu_q.contiguous(), ck = cu_k.contiguous();
  bool fused = varlen_fused(q);
  if (fused && deterministic)  // only version 2 orders its dq adds
    fused = varlen_orders_dq(varlen_params(q, k, v, cq, ck, max_q, max_k, scale, w, softcap));
  if (varlen_wide(q))  // version 2's d 256 kernel, or version 1's column halves
    fused = wide_backward_fused(varlen_params(q, k, v, cq, ck, max_q, max_k, scale, w, softcap), deterministic);
  const bool simt = varlen_simt(q, deterministic, fused);
  if (!simt && !fused)
    return day50::to_grad_dtypes(day50::reference_varlen_backward(grad_out, q, k, v, out, lse_, grad_lse_, cu_q, cu_k,
                                                                  max_q, max_k, scale, w, softcap),
                                 gd);
  const int64_t H = q.size(1), total_q = q.size(0), d = q.size(2);
  Tensor dq = kc::new_output(q.sizes(), q.options().dtype(gd.q));
  Tensor dk = kc::new_output(k.sizes(), q.options().dtype(gd.k));
  Tensor dv = kc::new_output(v.sizes(), q.options().dtype(gd.v));
  if (cu_q.size(0) > 1 && (total_q > 0 || k.size(0) > 0))
    KC_TORCH_CHECK_CUDA(day50::varlen_offsets_check(cq.data_ptr<int>(), ck.data_ptr<int>(), cq.size(0) - 1, q.size(0),
                                                    k.size(0), max_q, max_k, c10::cuda::getCurrentCUDAStream()));
  if (max_k == 0 || max_q == 0 || cu_q.size(0) == 1) {  // no pair of queries and keys interacts
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  const Tensor lse = lse_.contiguous();
  const Tensor grad_lse = grad_lse_.has_value() ? grad_lse_->contiguous() : Tensor();
  const Tensor qq = simt ? q : fused_ready3(q), kk = simt ? k : fused_ready3(k), vv = simt ? v : fused_ready3(v),
               go = simt ? grad_out : fused_ready3(grad_out);
  day50::FusedParams p = varlen_params(qq, kk, vv, cq, ck, max_q, max_k, scale, w, softcap);
  p.out = view3(out);
  p.dout = view3(go);
  p.lse = const_cast<float*>(lse.data_ptr<float>());
  p.grad_lse = grad_lse.defined() ? grad_lse.data_ptr<float>() : nullptr;
  p.dq_sb = 0;
  p.dq_sh = dq.stride(1);
  p.dq_sr = dq.stride(0);
  // Workspaces: O(H total_q d), in the (H, total_q) row layout.
  Tensor dsum = at::empty({H * total_q}, q.options().dtype(at::kFloat));
  p.dsum = dsum.data_ptr<float>();
  const at::ScalarType t = q.scalar_type();
  if (simt) {  // any strides: no copies; D is its only workspace
    const Tensor dqw = grad_target(dq, t, false), dkw = grad_target(dk, t, false), dvw = grad_target(dv, t, false);
    set_grad_targets(p, dqw, dkw, dvw, t);
    KC_TORCH_CHECK_CUDA(day50::simt_attention_backward(p, c10::cuda::getCurrentCUDAStream()));
    return copy_back(dq, dk, dv, dqw, dkw, dvw);
  }
  Tensor dq_accum = at::empty({H * total_q * d}, q.options().dtype(at::kFloat));
  p.dq_accum = dq_accum.data_ptr<float>();
  Tensor dq_sem;  // deterministic: one counter per (sequence, q head, query tile)
  if (deterministic) {
    p.deterministic = true;
    dq_sem = at::empty({p.B * H * day50::hopper_bwd_query_tiles(max_q)}, q.options().dtype(at::kInt));
    p.dq_sem = dq_sem.data_ptr<int>();
    p.dq_sem_ints = dq_sem.numel();  // zeroed by the pre-kernel
  }
  // Grouped-query attention: version 1 takes a whole group per CTA; version 2 one q head, adding
  // into an fp32 (2, Hk, total_k, d) accumulator (deterministic: partials per q head; flash_bwd.cu)
  const day50::FusedBwdPlan plan = day50::fused_backward_plan(p);
  p.heads_per_cta = plan.heads_per_cta;
  Tensor dkv_partial;
  if (plan.partial_floats > 0) {
    dkv_partial = at::empty({plan.partial_floats}, q.options().dtype(at::kFloat));
    p.dkv_partial = dkv_partial.data_ptr<float>();
  }
  p.dkv_zero_floats = plan.accum_floats;  // version 2 adds into it: the pre-kernel zeroes it
  const bool kv_post = p.H != p.Hk && plan.partial_floats > 0;  // as in the dense backward
  const Tensor dqw = grad_target(dq, t, true), dkw = grad_target(dk, t, kv_post), dvw = grad_target(dv, t, kv_post);
  set_grad_targets(p, dqw, dkw, dvw, t);
  KC_TORCH_CHECK_CUDA(day50::fused_attention_backward(p, c10::cuda::getCurrentCUDAStream()));
  return copy_back(dq, dk, dv, dqw, dkw, dvw);
}

Tensor matmul_cuda(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul: a and b must be 3-D (batch, rows, cols)");
  TORCH_CHECK(day50::is_supported_dtype(a.scalar_type()) && a.scalar_type() == b.scalar_type(),
              "matmul: a and b must have the same floating dtype, got ", a.scalar_type(), " and ", b.scalar_type());
  kc::check_same_device(a, "a", b, "b");
  TORCH_CHECK(a.size(0) == b.size(0), "matmul: batch sizes differ: ", kc::fmt(a.size(0)), " and ",
              kc::fmt(b.size(0)));
  const int64_t M = trans_a ? a.size(2) : a.size(1), K = trans_a ? a.size(1) : a.size(2);
  const int64_t Kb = trans_b ? b.size(2) : b.size(1), N = trans_b ? b.size(1) : b.size(2);
  TORCH_CHECK(K == Kb, "matmul: inner sizes differ: op(a) is ",
              kc::fmt(at::IntArrayRef({a.size(0), M, K})), ", op(b) is ",
              kc::fmt(at::IntArrayRef({b.size(0), Kb, N})));
  const c10::cuda::CUDAGuard guard(a.device());
  Tensor c = kc::new_output({a.size(0), M, N}, a.options());
  auto v3 = [](const Tensor& t) {
    View4 v;
    v.ptr = t.data_ptr();
    v.sh = t.stride(0);
    v.sr = t.stride(1);
    v.sc = t.stride(2);
    return v;
  };
  KC_TORCH_CHECK_CUDA(day50::naive_matmul(v3(a), v3(b), v3(c), 1, a.size(0), M, N, K, trans_a, trans_b, alpha,
                                          naive_type(a), c10::cuda::getCurrentCUDAStream()));
  return c;
}

}  // namespace

TORCH_LIBRARY_IMPL(day50, CUDA, m) {
  m.impl("attention_forward", &attention_forward_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
  m.impl("attention_varlen_forward", &attention_varlen_forward_cuda);
  m.impl("attention_varlen_backward", &attention_varlen_backward_cuda);
  m.impl("matmul", &matmul_cuda);
}
