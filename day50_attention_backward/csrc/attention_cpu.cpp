// CPU implementation: the readable reference. The same math as the kernels,
// in whole-tensor ATen ops, accumulated in float32 (float64 for float64 inputs).
//
// Forward:  S = scale * Q K^T (masked: -inf where causal and j > i),
//           lse = logsumexp_j S, P = exp(S - lse), O = P V.
// Backward (the seed's steps; P is recomputed from lse, never stored):
//           dV = P^T dO
//           dP = dO V^T
//           dS = P * (dP - D),  D_i = sum_j P_ij dP_ij = sum_c dO_ic O_ic  (minus grad_lse_i,
//                                because d lse_i / d S_ij = P_ij)
//           dQ = scale * dS K,  dK = scale * dS^T Q
// Grouped-query attention (k, v with Hk heads, Hk dividing H): the H q heads are
// viewed as (Hk, G = H / Hk) and k, v broadcast over G, so q head h = hk * G + g
// reads k/v head hk (SDPA's enable_gqa); dK and dV, computed per q head, are
// summed over g. Hk == H is G = 1.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "attention_checks.h"

namespace {

using at::Tensor;

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The reference math runs in the accumulation type whatever autocast says: under
// torch.autocast("cpu"), the matmuls below would otherwise run (and return) in the
// autocast dtype, and lse would come back in bf16. The op itself is not an
// autocast op: its inputs arrive in the dtype the caller gives.
using NoAutocast = c10::impl::ExcludeDispatchKeyGuard;

// Grouped views: a q-shaped (B, H, N, c) tensor as (B, Hk, G, N, c); a k-shaped
// (B, Hk, N, c) one as (B, Hk, 1, N, c), which matmul broadcasts over G.
Tensor q_grouped(const Tensor& t, int64_t hk) {
  return t.reshape({t.size(0), hk, hk == 0 ? 0 : t.size(1) / hk, t.size(2), t.size(3)});
}
Tensor kv_grouped(const Tensor& t) { return t.unsqueeze(2); }

// scale * q k^T with the causal mask (top-left aligned), in the accumulation type.
Tensor scores(const Tensor& qa, const Tensor& ka, bool causal, double scale) {
  Tensor s = at::matmul(qa, ka.transpose(-2, -1)).mul_(scale);
  if (causal) {
    const int64_t nq = qa.size(-2), nk = ka.size(-2);
    Tensor mask = at::ones({nq, nk}, qa.options().dtype(at::kBool)).triu_(1);
    s.masked_fill_(mask, -std::numeric_limits<double>::infinity());
  }
  return s;
}

std::tuple<Tensor, Tensor> attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                 std::optional<double> scale_opt, c10::string_view backend,
                                                 bool /*deterministic: every sum here has a fixed order*/) {
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  day50::parse_backend(std::string(backend));  // validated; the CPU has one implementation
  const double scale = day50::check_qkv(q, k, v, scale_opt);
  const auto acc = acc_type(q.scalar_type());
  const int64_t hk = k.size(1);
  Tensor s = scores(q_grouped(q.to(acc), hk), kv_grouped(k.to(acc)), causal, scale);  // (B, Hk, G, Nq, Nk)
  Tensor lse = at::logsumexp(s, -1);
  Tensor p = (s - lse.unsqueeze(-1)).exp_();
  Tensor out = day50::new_output_in_layout_of(q, q.sizes(), q.options());
  out.copy_(at::matmul(p, kv_grouped(v.to(acc))).reshape(q.sizes()));
  return {out, lse.reshape({q.size(0), q.size(1), q.size(2)}).contiguous()};
}

std::tuple<Tensor, Tensor, Tensor> attention_backward_cpu(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                          const Tensor& v, const Tensor& out, const Tensor& lse,
                                                          const std::optional<Tensor>& grad_lse, bool causal,
                                                          std::optional<double> scale_opt,
                                                          c10::string_view backend,
                                                          bool /*deterministic: always*/) {
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  day50::parse_backend(std::string(backend));
  const double scale = day50::check_qkv(q, k, v, scale_opt);
  day50::check_backward_args(grad_out, q, out, lse, grad_lse);
  const auto acc = acc_type(q.scalar_type());
  const int64_t hk = k.size(1);
  // (B, Hk, G, N, d) for the q-shaped tensors, (B, Hk, 1, Nk, d) for k and v
  const Tensor qa = q_grouped(q.to(acc), hk), doa = q_grouped(grad_out.to(acc), hk);
  const Tensor ka = kv_grouped(k.to(acc)), va = kv_grouped(v.to(acc));
  auto rows = [&](const Tensor& t) {  // (B, H, Nq) -> (B, Hk, G, Nq, 1)
    return q_grouped(t.unsqueeze(-1), hk);
  };
  Tensor p = (scores(qa, ka, causal, scale) - rows(lse)).exp_();  // exp(-inf) = 0 where masked
  Tensor dv = at::matmul(p.transpose(-2, -1), doa).sum(2);       // summed over the group
  Tensor dp = at::matmul(doa, va.transpose(-2, -1));
  Tensor dsum = (grad_out.to(acc) * out.to(acc)).sum(-1);
  if (grad_lse.has_value()) dsum = dsum - *grad_lse;
  Tensor ds = p * (dp - rows(dsum));
  Tensor dq = at::matmul(ds, ka).mul_(scale).reshape(q.sizes());
  Tensor dk = at::matmul(ds.transpose(-2, -1), qa).sum(2).mul_(scale);
  const auto t = q.scalar_type();
  Tensor dq_out = day50::new_output_in_layout_of(q, q.sizes(), q.options());
  dq_out.copy_(dq);
  return {dq_out, dk.to(t).contiguous(), dv.to(t).contiguous()};
}

Tensor matmul_cpu(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul: a and b must be 3-D (batch, rows, cols)");
  TORCH_CHECK(day50::is_supported_dtype(a.scalar_type()) && a.scalar_type() == b.scalar_type(),
              "matmul: a and b must have the same floating dtype, got ", a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.size(0) == b.size(0), "matmul: batch sizes differ: ", kc::fmt(a.size(0)), " and ",
              kc::fmt(b.size(0)));
  const Tensor oa = trans_a ? a.transpose(1, 2) : a;
  const Tensor ob = trans_b ? b.transpose(1, 2) : b;
  TORCH_CHECK(oa.size(2) == ob.size(1), "matmul: inner sizes differ: op(a) is ", kc::fmt(oa.sizes()),
              ", op(b) is ", kc::fmt(ob.sizes()));
  const auto acc = acc_type(a.scalar_type());
  return at::bmm(oa.to(acc), ob.to(acc)).mul_(alpha).to(a.scalar_type()).contiguous();
}

}  // namespace

TORCH_LIBRARY_IMPL(day50, CPU, m) {
  m.impl("attention_forward", &attention_forward_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
  m.impl("matmul", &matmul_cpu);
}
