// CPU implementation: the readable reference of the math, in double precision
// accumulation for every dtype (float64 too, for gradcheck). Rows are processed
// in parallel; dweight/dbias are reduced per column block with the rows in
// order, so the result does not depend on the number of threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <tuple>
#include <vector>

#include "kc/torch_utils.h"
#include "layernorm_checks.h"

namespace day26 {
namespace {

at::Tensor as_double_or_none(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->to(at::kDouble).contiguous() : at::Tensor();
}

at::ScalarType stat_dtype(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// The rows of either norm, in double: LayerNorm, or RMSNorm where mean is null (the mean is
// then taken as 0 and there is no bias). rstd is rounded to the stored dtype first, so y agrees
// with what the backward sees.
template <typename scalar_t, typename stat_t>
void norm_fwd_rows(const scalar_t* xp, scalar_t* yp, stat_t* mp, stat_t* rp, const double* wp, const double* bp,
                   int64_t rows, int64_t D, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const scalar_t* xr = xp + r * D;
      double m = 0;
      if (mp) {
        for (int64_t c = 0; c < D; ++c) m += double(xr[c]);
        m = D > 0 ? m / double(D) : 0.0;  // no element: mean 0 (rstd NaN), as torch's
      }
      double v = 0;
      for (int64_t c = 0; c < D; ++c) v += (double(xr[c]) - m) * (double(xr[c]) - m);
      const stat_t rs = stat_t(1.0 / std::sqrt(v / double(D) + eps));
      for (int64_t c = 0; c < D; ++c) {
        const double xhat = (double(xr[c]) - double(stat_t(m))) * double(rs);
        yp[r * D + c] = scalar_t(xhat * (wp ? wp[c] : 1.0) + (bp ? bp[c] : 0.0));
      }
      if (mp) mp[r] = stat_t(m);
      rp[r] = rs;
    }
  });
}

// The backward of either norm (mean null: RMSNorm), g = dy * weight, xhat = (x - mean) * rstd:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (RMSNorm: without the mean(g) term)
//   dweight = sum_rows(dy * xhat), dbias = sum_rows(dy)
// into dxp / aw / ab where not null; the column sums take the rows in order, so they do not
// depend on the number of threads.
template <typename scalar_t>
void norm_bwd_rows(const scalar_t* xp, const scalar_t* dyp, const double* mp, const double* rp, const double* wp,
                   int64_t rows, int64_t D, scalar_t* dxp, double* aw, double* ab) {
  auto xhat = [&](int64_t r, int64_t c) { return (double(xp[r * D + c]) - (mp ? mp[r] : 0.0)) * rp[r]; };
  if (dxp) {
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        double sg = 0, sgx = 0;
        for (int64_t c = 0; c < D; ++c) {
          const double g = double(dyp[r * D + c]) * (wp ? wp[c] : 1.0);
          if (mp) sg += g;
          sgx += g * xhat(r, c);
        }
        sg /= double(D);
        sgx /= double(D);
        for (int64_t c = 0; c < D; ++c) {
          const double g = double(dyp[r * D + c]) * (wp ? wp[c] : 1.0);
          dxp[r * D + c] = scalar_t(rp[r] * (g - sg - xhat(r, c) * sgx));
        }
      }
    });
  }
  if (aw || ab) {
    at::parallel_for(0, D, 256, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const double g = double(dyp[r * D + c]);
          if (aw) aw[c] += g * xhat(r, c);
          if (ab) ab[c] += g;
        }
    });
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cpu(const at::Tensor& x_, at::IntArrayRef nshape,
                                                                  const c10::optional<at::Tensor>& weight,
                                                                  const c10::optional<at::Tensor>& bias, double eps,
                                                                  int64_t version) {
  const LnShape s = ln_check_inputs(x_, nshape, weight, bias, /*allow_f64=*/true, version);  // devices too
  TORCH_CHECK(x_.device().is_cpu(), "layer_norm: input must be a CPU tensor here");
  const at::Tensor x = x_.contiguous();
  at::Tensor y = kc::new_output_like(x);
  at::Tensor mean = kc::new_output(s.lead, x.options().dtype(stat_dtype(x)));
  at::Tensor rstd = kc::new_output(s.lead, x.options().dtype(stat_dtype(x)));
  const at::Tensor w = as_double_or_none(weight), b = as_double_or_none(bias);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm_fwd_cpu", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    norm_fwd_rows<scalar_t, stat_t>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), mean.data_ptr<stat_t>(),
                                    rstd.data_ptr<stat_t>(), w.defined() ? w.data_ptr<double>() : nullptr,
                                    b.defined() ? b.data_ptr<double>() : nullptr, s.rows, s.cols, eps);
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cpu(
    const at::Tensor& dy_, const at::Tensor& x_, at::IntArrayRef nshape, const at::Tensor& mean_,
    const at::Tensor& rstd_, const c10::optional<at::Tensor>& weight, std::array<bool, 3> mask, int64_t version) {
  const LnShape s = ln_check_backward(dy_, x_, nshape, &mean_, rstd_, weight, /*allow_f64=*/true, version);
  TORCH_CHECK(x_.device().is_cpu(), "layer_norm backward: input must be a CPU tensor here");
  const at::Tensor x = x_.contiguous(), dy = dy_.contiguous();
  const at::Tensor mean = mean_.to(at::kDouble).contiguous(), rstd = rstd_.to(at::kDouble).contiguous();
  const bool has_w = weight.has_value() && weight->defined();
  const at::Tensor w = as_double_or_none(weight);
  const int64_t D = s.cols;
  const auto wdt = has_w ? weight->scalar_type() : x.scalar_type();
  at::Tensor dx = mask[0] ? kc::new_output_like(x) : at::empty({0}, x.options());
  at::Tensor dw = mask[1] && has_w ? kc::new_output(nshape, x.options().dtype(wdt)) : at::empty({0}, x.options());
  at::Tensor db = mask[2] ? kc::new_output(nshape, x.options().dtype(wdt)) : at::empty({0}, x.options());
  const bool want_w = mask[1] && has_w, want_b = mask[2];
  std::vector<double> aw(want_w ? D : 0, 0.0), ab(want_b ? D : 0, 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm_bwd_cpu", [&] {
    norm_bwd_rows<scalar_t>(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), mean.data_ptr<double>(),
                            rstd.data_ptr<double>(), has_w ? w.data_ptr<double>() : nullptr, s.rows, D,
                            mask[0] ? dx.data_ptr<scalar_t>() : nullptr, want_w ? aw.data() : nullptr,
                            want_b ? ab.data() : nullptr);
  });
  if (want_w) dw.copy_(at::from_blob(aw.data(), {D}, at::kDouble).view(nshape));
  if (want_b) db.copy_(at::from_blob(ab.data(), {D}, at::kDouble).view(nshape));
  // One column: dx is exactly 0 (x - mean is 0), as on CUDA.
  if (D == 1 && mask[0]) dx.zero_();
  return {dx, dw, db};
}

// RMSNorm: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), in double.
std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_cpu(const at::Tensor& x_, at::IntArrayRef nshape,
                                                    const c10::optional<at::Tensor>& weight, double eps,
                                                    int64_t version) {
  const LnShape s = ln_check_inputs(x_, nshape, weight, c10::nullopt, /*allow_f64=*/true, version, "rms_norm");
  TORCH_CHECK(x_.device().is_cpu(), "rms_norm: input must be a CPU tensor here");
  const at::Tensor x = x_.contiguous();
  at::Tensor y = kc::new_output_like(x);
  at::Tensor rstd = kc::new_output(s.lead, x.options().dtype(stat_dtype(x)));
  const at::Tensor w = as_double_or_none(weight);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm_fwd_cpu", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    norm_fwd_rows<scalar_t, stat_t>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), nullptr, rstd.data_ptr<stat_t>(),
                                    w.defined() ? w.data_ptr<double>() : nullptr, nullptr, s.rows, s.cols, eps);
  });
  return {y, rstd};
}

// dx = rstd * (g - xhat * mean(g * xhat)), xhat = x * rstd, g = dy * weight;
// dweight = sum_rows(dy * xhat).
std::tuple<at::Tensor, at::Tensor> rms_norm_bwd_cpu(const at::Tensor& dy_, const at::Tensor& x_,
                                                    at::IntArrayRef nshape, const at::Tensor& rstd_,
                                                    const c10::optional<at::Tensor>& weight, std::array<bool, 2> mask,
                                                    int64_t version) {
  const LnShape s = ln_check_backward(dy_, x_, nshape, nullptr, rstd_, weight, /*allow_f64=*/true, version, "rms_norm");
  TORCH_CHECK(x_.device().is_cpu(), "rms_norm backward: input must be a CPU tensor here");
  const at::Tensor x = x_.contiguous(), dy = dy_.contiguous();
  const at::Tensor rstd = rstd_.to(at::kDouble).contiguous();
  const bool has_w = weight.has_value() && weight->defined();
  const at::Tensor w = as_double_or_none(weight);
  const int64_t D = s.cols;
  const auto wdt = has_w ? weight->scalar_type() : x.scalar_type();
  at::Tensor dx = mask[0] ? kc::new_output_like(x) : at::empty({0}, x.options());
  at::Tensor dw = mask[1] && has_w ? kc::new_output(nshape, x.options().dtype(wdt)) : at::empty({0}, x.options());
  const bool want_w = mask[1] && has_w;
  std::vector<double> aw(want_w ? D : 0, 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm_bwd_cpu", [&] {
    norm_bwd_rows<scalar_t>(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), nullptr, rstd.data_ptr<double>(),
                            has_w ? w.data_ptr<double>() : nullptr, s.rows, D,
                            mask[0] ? dx.data_ptr<scalar_t>() : nullptr, want_w ? aw.data() : nullptr, nullptr);
  });
  if (want_w) dw.copy_(at::from_blob(aw.data(), {D}, at::kDouble).view(nshape));
  return {dx, dw};
}

// add_norm: the sum (rounded to x's dtype, as torch's add), then the norm of it.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_norm_fwd_cpu(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef nshape, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, double eps, bool rms, int64_t version) {
  ln_check_inputs(x, nshape, weight, bias, /*allow_f64=*/true, version, "add_norm");
  ln_check_same(x, residual, "add_norm", "residual", "input");
  TORCH_CHECK(!rms || !(bias.has_value() && bias->defined()), "add_norm: kind 'rms' takes no bias");
  TORCH_CHECK(x.device().is_cpu(), "add_norm: input must be a CPU tensor here");
  at::Tensor s = kc::new_output_like(x);
  at::add_out(s, x, residual);
  if (rms) {
    auto [y, rstd] = rms_norm_fwd_cpu(s, nshape, weight, eps, version);
    return {y, s, at::empty({0}, x.options().dtype(stat_dtype(x))), rstd};
  }
  auto [y, mean, rstd] = layer_norm_fwd_cpu(s, nshape, weight, bias, eps, version);
  return {y, s, mean, rstd};
}

// add_norm's backward: the norm's, then dx += dsum (the sum output's gradient).
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_norm_bwd_cpu(
    const at::Tensor& dy, const c10::optional<at::Tensor>& dsum, const at::Tensor& s, at::IntArrayRef nshape,
    const at::Tensor& mean, const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, bool rms,
    std::array<bool, 3> mask, int64_t version) {
  ln_check_backward(dy, s, nshape, rms ? nullptr : &mean, rstd, weight, /*allow_f64=*/true, version, "add_norm");
  TORCH_CHECK(!rms || !mask[2], "add_norm: kind 'rms' has no bias, so no dbias");
  const bool has_ds = dsum.has_value() && dsum->defined();
  if (has_ds) ln_check_same(s, *dsum, "add_norm backward", "the sum's gradient", "the sum");
  TORCH_CHECK(s.device().is_cpu(), "add_norm backward: input must be a CPU tensor here");
  at::Tensor dx, dw, db;
  if (rms) {
    std::tie(dx, dw) = rms_norm_bwd_cpu(dy, s, nshape, rstd, weight, {mask[0], mask[1]}, version);
    db = at::empty({0}, s.options());
  } else {
    std::tie(dx, dw, db) = layer_norm_bwd_cpu(dy, s, nshape, mean, rstd, weight, mask, version);
  }
  if (has_ds && mask[0]) dx.add_(*dsum);
  return {dx, dw, db};
}

}  // namespace
}  // namespace day26

TORCH_LIBRARY_IMPL(day26, CPU, m) {
  m.impl("layer_norm_fwd", &day26::layer_norm_fwd_cpu);
  m.impl("layer_norm_bwd", &day26::layer_norm_bwd_cpu);
  m.impl("rms_norm_fwd", &day26::rms_norm_fwd_cpu);
  m.impl("rms_norm_bwd", &day26::rms_norm_bwd_cpu);
  m.impl("add_norm_fwd", &day26::add_norm_fwd_cpu);
  m.impl("add_norm_bwd", &day26::add_norm_bwd_cpu);
}
