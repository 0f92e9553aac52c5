// se_cpu.cpp: CPU implementations of every se_module op. The same math as the
// CUDA kernels (se_fused.cu has the derivation), written as plain loops over
// NCHW-contiguous data with at::parallel_for. Arithmetic in float (double for
// float64 inputs, which gradcheck uses), except the sums over H * W, which
// accumulate in double: a plain sequential float sum over thousands of terms
// is less accurate than the GPU's tree reductions and torch's cascade sums. Outputs follow the layout rule of
// se_checks.h: channels_last inputs give channels_last outputs.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "se_checks.h"

namespace {

using se_glue::out_format;

template <typename acc_t>
inline acc_t sigmoid_(acc_t z) {
  return acc_t(1) / (acc_t(1) + std::exp(-z));
}
// The activations with torch's conventions at the kinks and NaN in, NaN out
// (the CUDA twins and the conventions: se_act.cuh). act: 0 ReLU, 1 SiLU,
// 2 Hardswish; gate: 0 Sigmoid, 1 Hardsigmoid.
template <typename acc_t>
inline acc_t act_f(acc_t z, int64_t act) {
  if (act == 1) return z * sigmoid_(z);
  if (act == 2) return z * std::min(std::max(z + acc_t(3), acc_t(0)), acc_t(6)) / acc_t(6);
  return (z > acc_t(0) || z != z) ? z : acc_t(0);
}
template <typename acc_t>
inline acc_t act_grad(acc_t z, int64_t act) {
  if (act == 1) {
    const acc_t sg = sigmoid_(z);
    return sg * (acc_t(1) + z * (acc_t(1) - sg));
  }
  if (act == 2) return z <= acc_t(-3) ? acc_t(0) : (z >= acc_t(3) ? acc_t(1) : z / acc_t(3) + acc_t(0.5));
  return z > acc_t(0) ? acc_t(1) : (z != z ? z : acc_t(0));
}
template <typename acc_t>
inline acc_t gate_f(acc_t z, int64_t gate) {
  if (gate == 0) return sigmoid_(z);
  return z != z ? z : std::min(std::max(z + acc_t(3), acc_t(0)), acc_t(6)) / acc_t(6);
}
// dz = ds * gate'(z) given z and s = gate_f(z)
template <typename acc_t>
inline acc_t gate_bwd(acc_t z, acc_t s, acc_t ds, int64_t gate) {
  if (gate == 0) return ds * s * (acc_t(1) - s);
  // 1/6 rounded to float even for double, as torch's hardsigmoid_backward has it (its
  // one_sixth is 1.0f / 6.0f): a converted float64 model gives torch's gradients exactly.
  const acc_t d = (z > acc_t(-3) && z < acc_t(3)) ? acc_t(1.0f / 6.0f) : (z != z ? z : acc_t(0));
  return ds * d;
}

// NCHW compute result -> the layout the op promises
at::Tensor to_format(const at::Tensor& t, at::MemoryFormat fmt) {
  return fmt == at::MemoryFormat::Contiguous ? t : t.contiguous(fmt);
}

at::ScalarType acc_type_of(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// ------------------------------------------------------------------ stages

at::Tensor global_avg_pool_cpu(const at::Tensor& x_, int64_t version) {
  se_glue::check_x(x_);
  se_glue::check_pool_version(version);
  const at::Tensor x = x_.contiguous();
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  at::Tensor out = at::empty({N, C}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "global_avg_pool_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        double acc = 0;
        for (int64_t l = 0; l < L; ++l) acc += double(acc_t(xp[r * L + l]));
        op[r] = scalar_t(acc_t(acc / double(L)));
      }
    });
  });
  return out;
}

at::Tensor global_avg_pool_backward_cpu(const at::Tensor& grad_, int64_t H, int64_t W, bool channels_last) {
  TORCH_CHECK(grad_.dim() == 2, "grad must be [N, C], got sizes ", kc::fmt(grad_.sizes()));
  se_glue::check_floating(grad_, "grad");
  TORCH_CHECK(H >= 1 && W >= 1, "H and W must be at least 1, got ", kc::fmt(H), " and ", kc::fmt(W));
  const at::Tensor g = grad_.contiguous();
  const int64_t N = g.size(0), C = g.size(1), L = H * W;
  at::Tensor out = at::empty({N, C, H, W}, g.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "global_avg_pool_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const scalar_t v = scalar_t(acc_t(gp[r]) / acc_t(L));
        for (int64_t l = 0; l < L; ++l) op[r * L + l] = v;
      }
    });
  });
  return to_format(out, channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
}

// op: 0 swish, 1 swish backward (a = grad, b = x), 2 sigmoid, 3 sigmoid backward (a = grad, b = y)
at::Tensor pointwise_cpu(const at::Tensor& a_, const at::Tensor* b_, int op, const char* name) {
  se_glue::check_floating(a_, name);
  if (b_ != nullptr) {
    TORCH_CHECK(b_->sizes() == a_.sizes() && b_->scalar_type() == a_.scalar_type(),
                name, ": grad and the saved tensor must have the same shape and dtype, got ", kc::fmt(a_.sizes()),
                " ", a_.scalar_type(), " and ", kc::fmt(b_->sizes()), " ", b_->scalar_type());
    se_glue::check_same_device(a_, "grad", *b_, "the saved tensor");
  }
  const at::Tensor a = a_.contiguous();
  const at::Tensor b = b_ != nullptr ? b_->contiguous() : a;
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "pointwise_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* ap = a.const_data_ptr<scalar_t>();
    const scalar_t* bp = b.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.numel(), 2048, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const acc_t av = acc_t(ap[i]);
        acc_t r;
        if (op == 0) {
          r = av * sigmoid_(av);
        } else if (op == 1) {
          const acc_t xv = acc_t(bp[i]), sg = sigmoid_(xv);
          r = av * sg * (acc_t(1) + xv * (acc_t(1) - sg));
        } else if (op == 2) {
          r = sigmoid_(av);
        } else {
          const acc_t y = acc_t(bp[i]);
          r = av * y * (acc_t(1) - y);
        }
        op_[i] = scalar_t(r);
      }
    });
  });
  return out;
}

at::Tensor swish_cpu(const at::Tensor& x) { return pointwise_cpu(x, nullptr, 0, "swish"); }
at::Tensor swish_backward_cpu(const at::Tensor& g, const at::Tensor& x) { return pointwise_cpu(g, &x, 1, "swish_backward"); }
at::Tensor sigmoid_cpu(const at::Tensor& x) { return pointwise_cpu(x, nullptr, 2, "sigmoid"); }
at::Tensor sigmoid_backward_cpu(const at::Tensor& g, const at::Tensor& y) { return pointwise_cpu(g, &y, 3, "sigmoid_backward"); }

at::Tensor excitation_cpu(const at::Tensor& x_, const at::Tensor& s_) {
  se_glue::check_x(x_);
  se_glue::check_nc(s_, "s", x_);
  const at::Tensor x = x_.contiguous();
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const at::Tensor s = s_.to(acc_type_of(x)).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "excitation_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const acc_t* sp = s.const_data_ptr<acc_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t l = 0; l < L; ++l) op[r * L + l] = scalar_t(acc_t(xp[r * L + l]) * sp[r]);
    });
  });
  return to_format(out, out_format(x_));
}

std::tuple<at::Tensor, at::Tensor> excitation_backward_cpu(const at::Tensor& grad_, const at::Tensor& x_,
                                                           const at::Tensor& s_) {
  se_glue::check_x(x_);
  se_glue::check_like_x(grad_, "grad", x_);
  se_glue::check_nc(s_, "s", x_);
  const at::Tensor x = x_.contiguous(), g = grad_.contiguous();
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  const at::Tensor s = s_.to(acc_type_of(x)).contiguous();
  at::Tensor gx = at::empty(x.sizes(), x.options());
  at::Tensor gs = at::empty({N, C}, s.options());  // accumulated in acc_t, cast to s's dtype below
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "excitation_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const acc_t* sp = s.const_data_ptr<acc_t>();
    scalar_t* gxp = gx.mutable_data_ptr<scalar_t>();
    acc_t* gsp = gs.mutable_data_ptr<acc_t>();
    at::parallel_for(0, N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        double acc = 0;
        for (int64_t l = 0; l < L; ++l) {
          const acc_t gv = acc_t(gp[r * L + l]);
          acc += double(gv) * double(acc_t(xp[r * L + l]));
          gxp[r * L + l] = scalar_t(gv * sp[r]);
        }
        gsp[r] = acc_t(acc);
      }
    });
  });
  return {to_format(gx, out_format(x_)), gs.to(s_.scalar_type())};
}

// ------------------------------------------------------------------ fused block

struct Weights {
  at::Tensor w1, b1, w2, b2;  // acc dtype, contiguous
};
Weights acc_weights(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2) {
  const auto t = acc_type_of(x);
  return {w1.to(t).contiguous(), b1.to(t).contiguous(), w2.to(t).contiguous(), b2.to(t).contiguous()};
}

// Per sample: p = mean_l x; z1 = w1 p + b1; a = act(z1); z2 = w2 a + b2; s = gate(z2).
template <typename acc_t>
void squeeze_sample(const acc_t* p, int64_t C, int64_t S, const Weights& w, int64_t act, int64_t gate, acc_t* z1,
                    acc_t* a, acc_t* z2, acc_t* s) {
  const acc_t *w1 = w.w1.const_data_ptr<acc_t>(), *b1 = w.b1.const_data_ptr<acc_t>();
  const acc_t *w2 = w.w2.const_data_ptr<acc_t>(), *b2 = w.b2.const_data_ptr<acc_t>();
  for (int64_t j = 0; j < S; ++j) {
    acc_t z = 0;
    for (int64_t c = 0; c < C; ++c) z += w1[j * C + c] * p[c];
    z1[j] = z + b1[j];
    a[j] = act_f(z1[j], act);
  }
  for (int64_t c = 0; c < C; ++c) {
    acc_t z = 0;
    for (int64_t j = 0; j < S; ++j) z += w2[c * S + j] * a[j];
    z2[c] = z + b2[c];
    s[c] = gate_f(z2[c], gate);
  }
}

at::Tensor se_block_cpu(const at::Tensor& x_, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                        const at::Tensor& b2, int64_t act, int64_t version, int64_t gate) {
  se_glue::check_x(x_);
  const int64_t S = se_glue::check_weights(x_, w1, b1, w2, b2);
  se_glue::check_activation(act);
  se_glue::check_scale_activation(gate);
  se_glue::check_fused_version(version);
  const at::Tensor x = x_.contiguous();
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  const Weights w = acc_weights(x, w1, b1, w2, b2);
  at::Tensor out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "se_block_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, N, 1, [&](int64_t nb, int64_t ne) {
      std::vector<acc_t> p(C), z1(S), a(S), z2(C), s(C);
      for (int64_t n = nb; n < ne; ++n) {
        const scalar_t* xn = xp + n * C * L;
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0;
          for (int64_t l = 0; l < L; ++l) acc += double(acc_t(xn[c * L + l]));
          p[c] = acc_t(acc / double(L));
        }
        squeeze_sample<acc_t>(p.data(), C, S, w, act, gate, z1.data(), a.data(), z2.data(), s.data());
        for (int64_t c = 0; c < C; ++c)
          for (int64_t l = 0; l < L; ++l) op[(n * C + c) * L + l] = scalar_t(acc_t(xn[c * L + l]) * s[c]);
      }
    });
  });
  return to_format(out, out_format(x_));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> se_block_backward_cpu(
    const at::Tensor& grad_, const at::Tensor& x_, const at::Tensor& w1_, const at::Tensor& b1_,
    const at::Tensor& w2_, const at::Tensor& b2_, int64_t act, int64_t version, int64_t gate,
    const std::optional<at::Tensor>& state) {
  se_glue::check_x(x_);
  se_glue::check_like_x(grad_, "grad", x_);
  const int64_t S = se_glue::check_weights(x_, w1_, b1_, w2_, b2_);
  if (state.has_value()) se_glue::check_state(*state, x_, S);  // checked, not read: this path recomputes
  se_glue::check_activation(act);
  se_glue::check_scale_activation(gate);
  se_glue::check_fused_version(version);
  const at::Tensor x = x_.contiguous(), g = grad_.contiguous();
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  const Weights w = acc_weights(x, w1_, b1_, w2_, b2_);
  const auto acc_opts = x.options().dtype(acc_type_of(x));
  at::Tensor dx = at::empty(x.sizes(), x.options());
  // per-sample values the weight gradients need
  at::Tensor P = at::empty({N, C}, acc_opts), A = at::empty({N, S}, acc_opts);
  at::Tensor DZ1 = at::empty({N, S}, acc_opts), DZ2 = at::empty({N, C}, acc_opts);
  at::Tensor dw1 = at::zeros({S, C}, acc_opts), db1 = at::zeros({S}, acc_opts);
  at::Tensor dw2 = at::zeros({C, S}, acc_opts), db2 = at::zeros({C}, acc_opts);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "se_block_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    const acc_t *w1 = w.w1.const_data_ptr<acc_t>(), *w2 = w.w2.const_data_ptr<acc_t>();
    acc_t *Pp = P.mutable_data_ptr<acc_t>(), *Ap = A.mutable_data_ptr<acc_t>();
    acc_t *DZ1p = DZ1.mutable_data_ptr<acc_t>(), *DZ2p = DZ2.mutable_data_ptr<acc_t>();
    at::parallel_for(0, N, 1, [&](int64_t nb, int64_t ne) {
      std::vector<acc_t> gs(C), z1(S), z2(C), s(C), coef(C);
      for (int64_t n = nb; n < ne; ++n) {
        const scalar_t* xn = xp + n * C * L;
        const scalar_t* gn = gp + n * C * L;
        acc_t* p = Pp + n * C;
        for (int64_t c = 0; c < C; ++c) {
          double sx = 0, sgx = 0;
          for (int64_t l = 0; l < L; ++l) {
            const double xv = double(acc_t(xn[c * L + l]));
            sx += xv;
            sgx += double(acc_t(gn[c * L + l])) * xv;
          }
          p[c] = acc_t(sx / double(L));
          gs[c] = acc_t(sgx);
        }
        acc_t* a = Ap + n * S;
        squeeze_sample<acc_t>(p, C, S, w, act, gate, z1.data(), a, z2.data(), s.data());
        acc_t* dz2 = DZ2p + n * C;
        for (int64_t c = 0; c < C; ++c) dz2[c] = gate_bwd(z2[c], s[c], gs[c], gate);
        acc_t* dz1 = DZ1p + n * S;
        for (int64_t j = 0; j < S; ++j) {
          acc_t d = 0;
          for (int64_t c = 0; c < C; ++c) d += w2[c * S + j] * dz2[c];
          dz1[j] = d * act_grad(z1[j], act);
        }
        for (int64_t c = 0; c < C; ++c) {
          acc_t d = 0;
          for (int64_t j = 0; j < S; ++j) d += w1[j * C + c] * dz1[j];
          coef[c] = d / acc_t(L);
        }
        for (int64_t c = 0; c < C; ++c)
          for (int64_t l = 0; l < L; ++l)
            dxp[(n * C + c) * L + l] = scalar_t(acc_t(gn[c * L + l]) * s[c] + coef[c]);
      }
    });
    // weight gradients: sums over the batch, in order
    acc_t *dw1p = dw1.mutable_data_ptr<acc_t>(), *db1p = db1.mutable_data_ptr<acc_t>();
    acc_t *dw2p = dw2.mutable_data_ptr<acc_t>(), *db2p = db2.mutable_data_ptr<acc_t>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < S; ++j) {
        db1p[j] += DZ1p[n * S + j];
        for (int64_t c = 0; c < C; ++c) dw1p[j * C + c] += DZ1p[n * S + j] * Pp[n * C + c];
      }
      for (int64_t c = 0; c < C; ++c) {
        db2p[c] += DZ2p[n * C + c];
        for (int64_t j = 0; j < S; ++j) dw2p[c * S + j] += DZ2p[n * C + c] * Ap[n * S + j];
      }
    }
  });
  // weight gradients in the weights' dtype and shape ([S, C] or the conv's [S, C, 1, 1])
  return {to_format(dx, out_format(x_)), dw1.to(w1_.scalar_type()).view(w1_.sizes()), db1.to(b1_.scalar_type()),
          dw2.to(w2_.scalar_type()).view(w2_.sizes()), db2.to(b2_.scalar_type())};
}

// The CPU keeps no saved state (its backward recomputes the MLP): the state is zeros
// of the shape the CUDA op returns.
std::tuple<at::Tensor, at::Tensor> se_block_train_cpu(const at::Tensor& x, const at::Tensor& w1,
                                                      const at::Tensor& b1, const at::Tensor& w2,
                                                      const at::Tensor& b2, int64_t act, int64_t version,
                                                      int64_t gate) {
  at::Tensor out = se_block_cpu(x, w1, b1, w2, b2, act, version, gate);
  at::Tensor state = at::zeros({x.size(0), se_glue::state_cols(x.size(1), w1.size(0))}, x.options().dtype(at::kFloat));
  return {out, state};
}

}  // namespace

TORCH_LIBRARY_IMPL(se_module, CPU, m) {
  m.impl("global_avg_pool", &global_avg_pool_cpu);
  m.impl("global_avg_pool_backward", &global_avg_pool_backward_cpu);
  m.impl("swish", &swish_cpu);
  m.impl("swish_backward", &swish_backward_cpu);
  m.impl("sigmoid", &sigmoid_cpu);
  m.impl("sigmoid_backward", &sigmoid_backward_cpu);
  m.impl("excitation", &excitation_cpu);
  m.impl("excitation_backward", &excitation_backward_cpu);
  m.impl("se_block", &se_block_cpu);
  m.impl("se_block_train", &se_block_train_cpu);
  m.impl("se_block_backward", &se_block_backward_cpu);
}
