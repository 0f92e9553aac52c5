// CPU implementation: the readable reference. The same math as the kernels,
// in whole-tensor ATen ops, accumulated in float32 (float64 for float64 inputs).
//
// Forward:  S = scale * Q K^T, capped to softcap * tanh(S / softcap) when softcap > 0,
//           masked (-inf) outside the window (attention_math.h: causal is its right edge),
//           lse = logsumexp_j S (+inf for a row that sees no key), P = exp(S - lse), O = P V.
// Backward (the seed's steps; P is recomputed from lse, never stored):
//           dV = P^T dO
//           dP = dO V^T
//           dS = P * (dP - D),  D_i = sum_j P_ij dP_ij = sum_c dO_ic O_ic  (minus grad_lse_i,
//                                because d lse_i / d S_ij = P_ij)
//           softcap: dS *= 1 - tanh^2(scale q.k / softcap)  (the cap's derivative)
//           dQ = scale * dS K,  dK = scale * dS^T Q
// Grouped-query attention (k, v with Hk heads, Hk dividing H): the H q heads are
// viewed as (Hk, G = H / Hk) and k, v broadcast over G, so q head h = hk * G + g
// reads k/v head hk (SDPA's enable_gqa); dK and dV, computed per q head, are
// summed over g. Hk == H is G = 1.
// Packed sequences (attention_varlen): the offsets are read on the host and each
// sequence runs the dense math with the window aligned bottom-right.
//
// The reference functions (attention_math.h) take any device: the CUDA glue runs them
// for the inputs its kernels do not take with a window or a softcap.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "attention_checks.h"
#include "attention_math.h"

namespace day50 {
namespace {

using at::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The reference math runs in the accumulation type whatever autocast says: under
// torch.autocast, the matmuls below would otherwise run (and return) in the
// autocast dtype, and lse would come back in bf16. The ops themselves take their
// inputs in the dtype the caller gives.
using NoAutocast = c10::impl::ExcludeDispatchKeyGuard;

// Grouped views: a q-shaped (B, H, N, c) tensor as (B, Hk, G, N, c); a k-shaped
// (B, Hk, N, c) one as (B, Hk, 1, N, c), which matmul broadcasts over G.
Tensor q_grouped(const Tensor& t, int64_t hk) {
  return t.reshape({t.size(0), hk, hk == 0 ? 0 : t.size(1) / hk, t.size(2), t.size(3)});
}
Tensor kv_grouped(const Tensor& t) { return t.unsqueeze(2); }

// (nq, nk) true where the window hides key j from query i; undefined when it hides nothing.
Tensor hidden_pairs(int64_t nq, int64_t nk, const Window& w, const at::TensorOptions& opts) {
  if (!w.bounded()) return Tensor();
  const int64_t off = w.bottom_right ? nk - nq : 0;
  const Tensor diag = at::arange(nq, opts.dtype(at::kLong)).add_(off).unsqueeze(1);  // i + off
  const Tensor j = at::arange(nk, opts.dtype(at::kLong)).unsqueeze(0);
  Tensor hide = at::zeros({nq, nk}, opts.dtype(at::kBool));
  if (w.right >= 0) hide.logical_or_(j > diag + w.right);
  if (w.left >= 0) hide.logical_or_(j < diag - w.left);
  return hide;
}

// The scores (capped, masked) in the accumulation type; *tanh_of: tanh(scale q.k / softcap)
// for the backward (only when softcap > 0).
Tensor scores(const Tensor& qa, const Tensor& ka, double scale, const Window& w, double softcap,
              Tensor* tanh_of = nullptr) {
  Tensor s = at::matmul(qa, ka.transpose(-2, -1)).mul_(scale);
  if (softcap > 0) {
    Tensor t = s.div_(softcap).tanh_();
    if (tanh_of != nullptr) *tanh_of = t;
    s = t * softcap;
  }
  const Tensor hide = hidden_pairs(qa.size(-2), ka.size(-2), w, qa.options());
  if (hide.defined()) s.masked_fill_(hide, -kInf);
  return s;
}

}  // namespace

Window make_window(at::IntArrayRef window, bool causal, bool bottom_right, const char* op) {
  TORCH_CHECK(window.size() == 2, op, ": window must be (left, right), got ", fmt(window));
  TORCH_CHECK(window[0] >= -1 && window[1] >= -1, op, ": window bounds must be -1 (unbounded) or >= 0, got ",
              fmt(window));
  Window w;
  w.left = window[0];
  w.right = causal ? 0 : window[1];
  w.bottom_right = bottom_right;
  return w;
}

double check_softcap(double softcap, const char* op) {
  TORCH_CHECK(std::isfinite(softcap) && softcap >= 0, op, ": softcap must be finite and >= 0 (0: none), got ",
              fmt(softcap));
  return softcap;
}

std::tuple<Tensor, Tensor> reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                             const Window& w, double softcap) {
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  const auto acc = acc_type(q.scalar_type());
  const int64_t hk = k.size(1);
  Tensor s = scores(q_grouped(q.to(acc), hk), kv_grouped(k.to(acc)), scale, w, softcap);  // (B, Hk, G, Nq, Nk)
  Tensor lse = at::logsumexp(s, -1);
  if (w.bounded()) lse.masked_fill_(lse == -kInf, kInf);  // rows that see no key: P = exp(-inf - inf) = 0
  Tensor p = (s - lse.unsqueeze(-1)).exp_();
  Tensor out = new_output_in_layout_of(q, q.sizes(), q.options());
  out.copy_(at::matmul(p, kv_grouped(v.to(acc))).reshape(q.sizes()));
  return {out, lse.reshape({q.size(0), q.size(1), q.size(2)}).contiguous()};
}

std::tuple<Tensor, Tensor, Tensor> reference_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out, const Tensor& lse,
                                                      const std::optional<Tensor>& grad_lse, double scale,
                                                      const Window& w, double softcap) {
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  const auto acc = acc_type(q.scalar_type());
  const int64_t hk = k.size(1);
  // (B, Hk, G, N, d) for the q-shaped tensors, (B, Hk, 1, Nk, d) for k and v
  const Tensor qa = q_grouped(q.to(acc), hk), doa = q_grouped(grad_out.to(acc), hk);
  const Tensor ka = kv_grouped(k.to(acc)), va = kv_grouped(v.to(acc));
  auto rows = [&](const Tensor& t) {  // (B, H, Nq) -> (B, Hk, G, Nq, 1)
    return q_grouped(t.to(acc).unsqueeze(-1), hk);
  };
  Tensor tanh_of;
  Tensor p = (scores(qa, ka, scale, w, softcap, &tanh_of) - rows(lse)).exp_();  // exp(-inf) = 0 where masked
  Tensor dv = at::matmul(p.transpose(-2, -1), doa).sum(2);                     // summed over the group
  Tensor dp = at::matmul(doa, va.transpose(-2, -1));
  Tensor dsum = (grad_out.to(acc) * out.to(acc)).sum(-1);
  if (grad_lse.has_value()) dsum = dsum - grad_lse->to(acc);
  Tensor ds = p * (dp - rows(dsum));
  if (softcap > 0) ds.mul_(1 - tanh_of * tanh_of);
  Tensor dq = at::matmul(ds, ka).mul_(scale).reshape(q.sizes());
  Tensor dk = at::matmul(ds.transpose(-2, -1), qa).sum(2).mul_(scale);
  // each gradient in its input's layout (attention_checks.h, layout_strides), as the kernels
  Tensor dq_out = new_output_in_layout_of(q, q.sizes(), q.options());
  Tensor dk_out = new_output_in_layout_of(k, k.sizes(), k.options());
  Tensor dv_out = new_output_in_layout_of(v, v.sizes(), v.options());
  dq_out.copy_(dq);
  dk_out.copy_(dk);
  dv_out.copy_(dv);
  return {dq_out, dk_out, dv_out};
}

double check_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                    int64_t max_q, int64_t max_k, std::optional<double> scale, const char* op) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, op, ": q, k, v must be 3-D (total, heads, d), got ",
              fmt(q.dim()), "-D, ", fmt(k.dim()), "-D, ", fmt(v.dim()), "-D");
  TORCH_CHECK(is_supported_dtype(q.scalar_type()), op, ": q must be float64, float32, float16 or bfloat16, got ",
              q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
              ": q, k, v must have the same dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), op,
              ": q, k, v must be on the same device, got ", q.device(), ", ", k.device(), ", ", v.device());
  TORCH_CHECK(k.size(0) == v.size(0) && k.size(1) == v.size(1), op, ": k ", fmt(k.sizes()), " and v ",
              fmt(v.sizes()), " must have the same shape");
  const int64_t hq = q.size(1), hk = k.size(1);
  TORCH_CHECK(hk > 0 && hq > 0 && hq % hk == 0, op, ": the number of q heads (", fmt(hq),
              ") must be a positive multiple of the number of k and v heads (", fmt(hk), ")");
  TORCH_CHECK(k.size(2) == q.size(2) && v.size(2) == q.size(2) && q.size(2) > 0, op,
              ": q, k, v must have the same positive head dim, got ", fmt(q.size(2)), ", ", fmt(k.size(2)), ", ",
              fmt(v.size(2)));
  for (const Tensor* cu : {&cu_q, &cu_k}) {
    const char* name = cu == &cu_q ? "cu_seqlens_q" : "cu_seqlens_k";
    TORCH_CHECK(cu->scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", cu->scalar_type());
    TORCH_CHECK(cu->dim() == 1 && cu->size(0) >= 1, op, ": ", name,
                " must be 1-D with B + 1 >= 1 entries (cumulative lengths from 0), got shape ", fmt(cu->sizes()));
    TORCH_CHECK(cu->device() == q.device(), op, ": ", name, " must be on q's device ", q.device(), ", got ",
                cu->device());
  }
  TORCH_CHECK(cu_q.size(0) == cu_k.size(0), op, ": cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got ",
              fmt(cu_q.size(0)), " and ", fmt(cu_k.size(0)));
  TORCH_CHECK(max_q >= 0 && max_k >= 0, op, ": max_seqlen_q and max_seqlen_k must be >= 0, got ", fmt(max_q), " and ",
              fmt(max_k));
  const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(double(q.size(2)));
  TORCH_CHECK(std::isfinite(s), op, ": scale must be finite, got ", fmt(s));
  return s;
}

void check_varlen_backward(const Tensor& grad_out, const Tensor& q, const Tensor& out, const Tensor& lse,
                           const std::optional<Tensor>& grad_lse) {
  const char* op = "attention_varlen_backward";
  TORCH_CHECK(grad_out.sizes() == q.sizes() && out.sizes() == q.sizes(), op, ": grad_out ", fmt(grad_out.sizes()),
              " and out ", fmt(out.sizes()), " must have q's shape ", fmt(q.sizes()));
  TORCH_CHECK(grad_out.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(), op,
              ": grad_out and out must have q's dtype ", q.scalar_type());
  TORCH_CHECK(grad_out.device() == q.device() && out.device() == q.device() && lse.device() == q.device(), op,
              ": grad_out, out and lse must be on q's device ", q.device());
  const auto want = std::vector<int64_t>{q.size(1), q.size(0)};
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(want), op, ": lse must be (H, total_q) = ", fmt(at::IntArrayRef(want)),
              ", got ", fmt(lse.sizes()));
  TORCH_CHECK(lse.scalar_type() == lse_dtype(q.scalar_type()), op, ": lse must be ", lse_dtype(q.scalar_type()),
              " for ", q.scalar_type(), " inputs, got ", lse.scalar_type());
  if (grad_lse.has_value()) {
    TORCH_CHECK(grad_lse->sizes() == lse.sizes() && grad_lse->scalar_type() == lse.scalar_type() &&
                    grad_lse->device() == lse.device(),
                op, ": grad_lse must match lse (", fmt(lse.sizes()), ", ", lse.scalar_type(), ")");
  }
}

namespace {

// The offsets on the host, checked against the packed tensors: cu[0] = 0, nondecreasing,
// cu[B] = the packed length, every length at most max_seqlen.
std::vector<int64_t> host_offsets(const Tensor& cu, int64_t total, int64_t max_len, const char* name) {
  const Tensor c = cu.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* x = c.data_ptr<int64_t>();
  std::vector<int64_t> r(x, x + c.numel());
  TORCH_CHECK(r[0] == 0, "attention_varlen: ", name, "[0] must be 0, got ", fmt(r[0]));
  for (size_t b = 1; b < r.size(); ++b) {
    TORCH_CHECK(r[b] >= r[b - 1], "attention_varlen: ", name, " must be nondecreasing, got ", fmt(r[b - 1]),
                " then ", fmt(r[b]));
    TORCH_CHECK(r[b] - r[b - 1] <= max_len, "attention_varlen: sequence ", fmt(int64_t(b - 1)), " has length ",
                fmt(r[b] - r[b - 1]), " in ", name, ", more than its max_seqlen ", fmt(max_len));
  }
  TORCH_CHECK(r.back() == total, "attention_varlen: ", name, "[-1] must be the packed length ", fmt(total), ", got ",
              fmt(r.back()));
  return r;
}

// A sequence's rows of a packed (total, H, d) tensor as a dense (1, H, n, d) view.
Tensor seq_view(const Tensor& t, int64_t r0, int64_t n) { return t.narrow(0, r0, n).permute({1, 0, 2}).unsqueeze(0); }

}  // namespace

std::tuple<Tensor, Tensor> reference_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                                                    int64_t max_k, double scale, const Window& w, double softcap) {
  const auto oq = host_offsets(cu_q, q.size(0), max_q, "cu_seqlens_q");
  const auto ok = host_offsets(cu_k, k.size(0), max_k, "cu_seqlens_k");
  Window wb = w;
  wb.bottom_right = true;
  Tensor out = kc::new_output(q.sizes(), q.options());
  Tensor lse = kc::new_output({q.size(1), q.size(0)}, q.options().dtype(lse_dtype(q.scalar_type())));
  for (size_t b = 0; b + 1 < oq.size(); ++b) {
    const int64_t q0 = oq[b], nq = oq[b + 1] - q0, k0 = ok[b], nk = ok[b + 1] - k0;
    if (nq == 0) continue;
    if (nk == 0) {  // no keys: every row sees none
      out.narrow(0, q0, nq).zero_();
      lse.narrow(1, q0, nq).fill_(kInf);
      continue;
    }
    auto [o, l] = reference_forward(seq_view(q, q0, nq), seq_view(k, k0, nk), seq_view(v, k0, nk), scale, wb, softcap);
    out.narrow(0, q0, nq).copy_(o[0].permute({1, 0, 2}));
    lse.narrow(1, q0, nq).copy_(l[0]);
  }
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> reference_varlen_backward(const Tensor& grad_out, const Tensor& q,
                                                             const Tensor& k, const Tensor& v, const Tensor& out,
                                                             const Tensor& lse, const std::optional<Tensor>& grad_lse,
                                                             const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                                                             int64_t max_k, double scale, const Window& w,
                                                             double softcap) {
  const auto oq = host_offsets(cu_q, q.size(0), max_q, "cu_seqlens_q");
  const auto ok = host_offsets(cu_k, k.size(0), max_k, "cu_seqlens_k");
  Window wb = w;
  wb.bottom_right = true;
  Tensor dq = kc::new_output(q.sizes(), q.options());
  Tensor dk = kc::new_output(k.sizes(), k.options());
  Tensor dv = kc::new_output(v.sizes(), v.options());
  for (size_t b = 0; b + 1 < oq.size(); ++b) {
    const int64_t q0 = oq[b], nq = oq[b + 1] - q0, k0 = ok[b], nk = ok[b + 1] - k0;
    if (nq == 0 || nk == 0) {  // no pair of this sequence interacts
      dq.narrow(0, q0, nq).zero_();
      dk.narrow(0, k0, nk).zero_();
      dv.narrow(0, k0, nk).zero_();
      continue;
    }
    auto rows = [&](const Tensor& t) { return t.narrow(1, q0, nq).unsqueeze(0); };  // (H, total_q) -> (1, H, nq)
    const std::optional<Tensor> gl = grad_lse.has_value() ? std::optional<Tensor>(rows(*grad_lse)) : std::nullopt;
    auto [a, bk, bv] = reference_backward(seq_view(grad_out, q0, nq), seq_view(q, q0, nq), seq_view(k, k0, nk),
                                          seq_view(v, k0, nk), seq_view(out, q0, nq), rows(lse), gl, scale, wb,
                                          softcap);
    dq.narrow(0, q0, nq).copy_(a[0].permute({1, 0, 2}));
    dk.narrow(0, k0, nk).copy_(bk[0].permute({1, 0, 2}));
    dv.narrow(0, k0, nk).copy_(bv[0].permute({1, 0, 2}));
  }
  return {dq, dk, dv};
}

namespace {

std::tuple<Tensor, Tensor> attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                 std::optional<double> scale_opt, c10::string_view backend,
                                                 bool /*deterministic: every sum here has a fixed order*/,
                                                 at::IntArrayRef window, double softcap) {
  parse_backend(std::string(backend));  // validated; the CPU has one implementation
  const double scale = check_qkv(q, k, v, scale_opt);
  const Window w = make_window(window, causal, false, "attention");
  if (no_keys(k)) return no_keys_forward(q);
  return reference_forward(q, k, v, scale, w, check_softcap(softcap, "attention"));
}

std::tuple<Tensor, Tensor, Tensor> attention_backward_cpu(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                          const Tensor& v, const Tensor& out, const Tensor& lse,
                                                          const std::optional<Tensor>& grad_lse, bool causal,
                                                          std::optional<double> scale_opt,
                                                          c10::string_view backend, bool /*deterministic: always*/,
                                                          at::IntArrayRef window, double softcap,
                                                          std::optional<at::ScalarType> dq_dtype,
                                                          std::optional<at::ScalarType> dk_dtype,
                                                          std::optional<at::ScalarType> dv_dtype) {
  parse_backend(std::string(backend));
  const double scale = check_qkv(q, k, v, scale_opt);
  check_backward_args(grad_out, q, out, lse, grad_lse);
  const GradDtypes gd = grad_dtypes(q, k, v, dq_dtype, dk_dtype, dv_dtype, "attention_backward");
  const Window w = make_window(window, causal, false, "attention_backward");
  if (no_keys(k)) return no_keys_backward(q, k, v, gd);
  return to_grad_dtypes(
      reference_backward(grad_out, q, k, v, out, lse, grad_lse, scale, w, check_softcap(softcap, "attention_backward")),
      gd);
}

std::tuple<Tensor, Tensor> attention_varlen_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                                        const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                                                        int64_t max_k, bool causal, std::optional<double> scale_opt,
                                                        at::IntArrayRef window, double softcap,
                                                        bool /*deterministic: always*/) {
  const char* op = "attention_varlen";
  const double scale = check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale_opt, op);
  return reference_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, make_window(window, causal, true, op),
                                  check_softcap(softcap, op));
}

std::tuple<Tensor, Tensor, Tensor> attention_varlen_backward_cpu(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& grad_lse, const Tensor& cu_q, const Tensor& cu_k, int64_t max_q, int64_t max_k,
    bool causal, std::optional<double> scale_opt, at::IntArrayRef window, double softcap, bool /*deterministic*/,
    std::optional<at::ScalarType> dq_dtype, std::optional<at::ScalarType> dk_dtype,
    std::optional<at::ScalarType> dv_dtype) {
  const char* op = "attention_varlen_backward";
  const double scale = check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale_opt, op);
  check_varlen_backward(grad_out, q, out, lse, grad_lse);
  const GradDtypes gd = grad_dtypes(q, k, v, dq_dtype, dk_dtype, dv_dtype, op);
  return to_grad_dtypes(reference_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, max_q, max_k,
                                                  scale, make_window(window, causal, true, op),
                                                  check_softcap(softcap, op)),
                        gd);
}

Tensor matmul_cpu(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul: a and b must be 3-D (batch, rows, cols)");
  TORCH_CHECK(is_supported_dtype(a.scalar_type()) && a.scalar_type() == b.scalar_type(),
              "matmul: a and b must have the same floating dtype, got ", a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.size(0) == b.size(0), "matmul: batch sizes differ: ", fmt(a.size(0)), " and ", fmt(b.size(0)));
  const Tensor oa = trans_a ? a.transpose(1, 2) : a;
  const Tensor ob = trans_b ? b.transpose(1, 2) : b;
  TORCH_CHECK(oa.size(2) == ob.size(1), "matmul: inner sizes differ: op(a) is ", fmt(oa.sizes()), ", op(b) is ",
              fmt(ob.sizes()));
  const auto acc = acc_type(a.scalar_type());
  return at::bmm(oa.to(acc), ob.to(acc)).mul_(alpha).to(a.scalar_type()).contiguous();
}

}  // namespace
}  // namespace day50

TORCH_LIBRARY_IMPL(day50, CPU, m) {
  m.impl("attention_forward", &day50::attention_forward_cpu);
  m.impl("attention_backward", &day50::attention_backward_cpu);
  m.impl("attention_varlen_forward", &day50::attention_varlen_forward_cpu);
  m.impl("attention_varlen_backward", &day50::attention_varlen_backward_cpu);
  m.impl("matmul", &day50::matmul_cpu);
}
