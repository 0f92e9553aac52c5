// The masking rules of the day-50 ops and the reference math (attention_cpu.cpp), shared by
// the CPU implementation and the CUDA glue (which runs the reference on the GPU for the
// inputs no fused kernel takes with a window or a softcap).
//
// Window (flash-attn's window_size): query i of a sequence of nq queries sees key j of its
// nk keys when i + off - left <= j <= i + off + right (a bound of -1 is no bound), with
// off = 0 (dense attention(): top-left, as SDPA's causal) or nk - nq (attention_varlen:
// bottom-right, flash-attn's). causal=True is right = 0. Rows that see no key: out 0,
// lse +inf, zero gradients (attention.h's FusedParams says the same for the kernels).
// Softcap > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap).
#pragma once

#include <optional>
#include <tuple>

#include <ATen/ATen.h>

namespace day50 {

struct Window {
  int64_t left = -1, right = -1;
  bool bottom_right = false;
  bool bounded() const { return left >= 0 || right >= 0; }
};

// window must have two entries, each -1 or >= 0; causal sets right to 0 (flash-attn's rule:
// causal is the window's right edge on the diagonal).
Window make_window(at::IntArrayRef window, bool causal, bool bottom_right, const char* op);
// softcap must be finite and >= 0 (0: no softcap). Returns it.
double check_softcap(double softcap, const char* op);

// Dense reference on any device, in whole-tensor ATen ops (float32 accumulation, float64 for
// float64): q (B, H, Nq, d), k, v (B, Hk, Nk, d). Returns (out in q's layout, lse (B, H, Nq)).
std::tuple<at::Tensor, at::Tensor> reference_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     double scale, const Window& w, double softcap);
// Returns (dq in q's layout, dk, dv contiguous).
std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                  const at::Tensor& k, const at::Tensor& v,
                                                                  const at::Tensor& out, const at::Tensor& lse,
                                                                  const std::optional<at::Tensor>& grad_lse,
                                                                  double scale, const Window& w, double softcap);

// Packed sequences: q (total_q, H, d), k, v (total_k, Hk, d), cu_seqlens int32 (B + 1).
// check_varlen validates what can be seen without reading the offsets (dtype, shapes,
// devices) and returns the scale; the reference reads the offsets on the host (a sync on
// CUDA), checks them, and runs the dense reference per sequence (w.bottom_right is set).
double check_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q,
                    const at::Tensor& cu_k, int64_t max_q, int64_t max_k, std::optional<double> scale,
                    const char* op);
std::tuple<at::Tensor, at::Tensor> reference_varlen_forward(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, const at::Tensor& cu_q,
                                                            const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                                                            double scale, const Window& w, double softcap);
std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_varlen_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& grad_lse, const at::Tensor& cu_q, const at::Tensor& cu_k,
    int64_t max_q, int64_t max_k, double scale, const Window& w, double softcap);
// The varlen backward's extra tensors: grad_out, out like q; lse (H, total_q) in the lse dtype.
void check_varlen_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& out,
                           const at::Tensor& lse, const std::optional<at::Tensor>& grad_lse);

}  // namespace day50
