// Calibration of the time assumptions: Levenberg–Marquardt on the relative step-time residuals,
// finite-difference Jacobian, bounds by a logistic change of variables, identifiability checked
// by the scaled Jacobian's singular values (docs/calibration.md).
#include "distplan/planner/calibrate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <Eigen/Dense>

#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"

namespace distplan {

namespace {

// The fittable assumptions. To make a new continuous `double` field of `Assumptions` fittable,
// add one line here; bounds must lie inside the range the scenario parser accepts for it.
constexpr std::array kFitParameters{
    preset_field<&Assumptions::compute_efficiency>(
        "compute_efficiency", 1e-3, 1.0,
        "GEMM efficiency ceiling: achieved / dense peak FLOP/s (0: the GPU preset's "
        "gemm_efficiency)",
        [](const Scenario& s) { return s.cluster.gpu.gemm_efficiency; }),
    when_named(preset_field<&Assumptions::memory_efficiency>(
        "memory_efficiency", 1e-3, 1.0,
        "achieved / nominal HBM bandwidth of the bandwidth-bound kernels (0: the GPU preset's)",
        [](const Scenario& s) { return s.cluster.gpu.memory_efficiency; })),
    when_named(preset_field<&Assumptions::fp8_compute_efficiency>(
        "fp8_compute_efficiency", 1e-3, 1.0,
        "FP8 GEMM ceiling: achieved / dense FP8 peak (0: the GPU preset's fp8_gemm_efficiency, "
        "else its gemm_efficiency)",
        [](const Scenario& s) {
          const GpuSpec& g = s.cluster.gpu;
          return g.fp8_gemm_efficiency > 0 ? g.fp8_gemm_efficiency : g.gemm_efficiency;
        })),
    when_named(fit_field<&Assumptions::grouped_gemm_efficiency>(
        "grouped_gemm_efficiency", 1e-3, 1.0,
        "MoE grouped GEMMs against a dense GEMM of the same tiles")),
    when_named(fit_field<&Assumptions::clock_power_exponent>(
        "clock_power_exponent", 0.0, 1.0,
        "compute clock under a power limit: (limit / tdp)^exponent")),
    fit_field<&Assumptions::communication_efficiency>(
        "communication_efficiency", 1e-3, 1.0,
        "achieved / nominal link bandwidth of large collectives (bus bandwidth)"),
    when_named(fit_field<&Assumptions::kernel_launch_seconds>(
        "kernel_launch_seconds", 0.0, 1e-2, "seconds per kernel launch between kernels")),
    when_named(fit_field<&Assumptions::overlap_compute_slowdown>(
        "overlap_compute_slowdown", 0.0, 1.0,
        "compute slowdown while overlapped NCCL kernels share the SMs")),
};

// A parameter whose 1 % change moves no run's predicted step time by more than 1e-6 (relative)
// is one the runs do not constrain: max_i |d r_i / d theta| * scale below this, with scale the
// value itself, or a tenth of the range for a value near zero (so a parameter whose range starts
// at 0 is judged by a meaningful change, not by its tiny starting value).
constexpr double kMinSensitivity = 1e-4;
// Largest accepted condition number of JᵀJ (columns scaled to unit length, so it measures how
// nearly parallel the parameters' effects are, not their units). 1e6 is cond(J) = 1e3: a 0.1 %
// measurement error could move the parameters by up to ~100 %, past which the fit says nothing.
constexpr double kMaxCondition = 1e6;
// Right-singular-vector weight above which a parameter is named as part of a confounded set.
constexpr double kConfoundedWeight = 0.2;
// Fraction of [lower, upper] kept from either bound when starting, and the distance at which a
// fitted value is reported as on its bound.
constexpr double kBoundMargin = 1e-3;
constexpr double kAtBound = 1e-6;

using Vec = Eigen::VectorXd;
using Mat = Eigen::MatrixXd;

double sigmoid(double u) {
  return 1.0 / (1.0 + std::exp(-u));
}

struct Problem {
  const std::vector<const CalibrationRun*>& runs;
  const std::vector<const FitParameter*>& params;
  Assumptions start;  // starting values of the fitted fields
  const StepTimeFunction& step;
  mutable std::vector<Scenario> work = {};  // the runs' scenarios, fitted fields overwritten

  [[nodiscard]] std::size_t n() const { return runs.size(); }
  [[nodiscard]] std::size_t p() const { return params.size(); }

  // The run's own assumptions with the fitted ones replaced: what is not fitted (overlap flags,
  // other efficiencies) describes how that run was set up.
  [[nodiscard]] Assumptions at(const CalibrationRun& run, const Vec& theta) const {
    Assumptions a = run.scenario.assumptions;
    for (std::size_t j = 0; j < p(); ++j) params[j]->set(a, theta[static_cast<Eigen::Index>(j)]);
    return a;
  }
  // r_i = predicted_i / measured_i - 1. The scenarios are copied once, not per evaluation.
  [[nodiscard]] Vec residuals(const Vec& theta) const {
    if (work.size() != n()) {
      work.clear();
      for (const CalibrationRun* r : runs) work.push_back(r->scenario);
    }
    Vec r(static_cast<Eigen::Index>(n()));
    for (std::size_t i = 0; i < n(); ++i) {
      for (std::size_t j = 0; j < p(); ++j)
        params[j]->set(work[i].assumptions, theta[static_cast<Eigen::Index>(j)]);
      r[static_cast<Eigen::Index>(i)] = step(work[i]) / runs[i]->measured_step_seconds - 1.0;
    }
    return r;
  }
  // d r / d theta by central differences (one-sided at a bound).
  [[nodiscard]] Mat jacobian(const Vec& theta) const {
    Mat J(static_cast<Eigen::Index>(n()), static_cast<Eigen::Index>(p()));
    for (std::size_t j = 0; j < p(); ++j) {
      const auto jj = static_cast<Eigen::Index>(j);
      const FitParameter& f = *params[j];
      const double h = 1e-6 * std::max(std::abs(theta[jj]), (f.upper - f.lower) * 1e-3);
      Vec hi = theta, lo = theta;
      hi[jj] = std::min(f.upper, theta[jj] + h);
      lo[jj] = std::max(f.lower, theta[jj] - h);
      J.col(jj) = (residuals(hi) - residuals(lo)) / (hi[jj] - lo[jj]);
    }
    return J;
  }
  [[nodiscard]] Vec to_theta(const Vec& u) const {
    Vec t(u.size());
    for (Eigen::Index j = 0; j < u.size(); ++j) {
      const FitParameter& f = *params[static_cast<std::size_t>(j)];
      t[j] = f.lower + (f.upper - f.lower) * sigmoid(u[j]);
    }
    return t;
  }
  [[nodiscard]] Vec to_u(const Vec& theta) const {
    Vec u(theta.size());
    for (Eigen::Index j = 0; j < theta.size(); ++j) {
      const FitParameter& f = *params[static_cast<std::size_t>(j)];
      const double x =
          std::clamp((theta[j] - f.lower) / (f.upper - f.lower), kBoundMargin, 1 - kBoundMargin);
      u[j] = std::log(x / (1 - x));
    }
    return u;
  }
  // d theta / d u.
  [[nodiscard]] Vec dtheta_du(const Vec& u) const {
    Vec d(u.size());
    for (Eigen::Index j = 0; j < u.size(); ++j) {
      const FitParameter& f = *params[static_cast<std::size_t>(j)];
      const double s = sigmoid(u[j]);
      d[j] = (f.upper - f.lower) * s * (1 - s);
    }
    return d;
  }
};

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? " and " : ", ";
    s += names[i];
  }
  return s;
}

// Sensitivities max_i |d r_i / d theta_j| * scale_j per parameter (kMinSensitivity).
Vec sensitivities(const Mat& J, const Vec& theta, const std::vector<const FitParameter*>& params) {
  Vec s(J.cols());
  for (Eigen::Index j = 0; j < J.cols(); ++j) {
    const FitParameter& f = *params[static_cast<std::size_t>(j)];
    const double scale = std::max(std::abs(theta[j]), 0.1 * (f.upper - f.lower));
    s[j] = J.col(j).cwiseAbs().maxCoeff() * scale;
  }
  return s;
}

// Refuses a Jacobian whose parameters the runs cannot tell apart; returns cond(JᵀJ) (scaled).
double check_conditioning(const Mat& J, const std::vector<const FitParameter*>& params,
                          std::string_view when) {
  Mat Js = J;
  for (Eigen::Index j = 0; j < Js.cols(); ++j) Js.col(j) /= Js.col(j).norm();
  const Eigen::JacobiSVD<Mat> svd(Js, Eigen::ComputeFullV);
  const Vec& sv = svd.singularValues();  // descending
  const double smax = sv[0], smin = sv[sv.size() - 1];
  const double cond =
      smin > 0 ? (smax / smin) * (smax / smin) : std::numeric_limits<double>::infinity();
  if (cond <= kMaxCondition) return cond;
  const Vec v = svd.matrixV().col(svd.matrixV().cols() - 1);
  std::vector<std::string> names;
  for (Eigen::Index j = 0; j < v.size(); ++j)
    if (std::abs(v[j]) >= kConfoundedWeight)
      names.emplace_back(params[static_cast<std::size_t>(j)]->name);
  throw InputError(
      "/runs",
      fmt::format(
          "the runs cannot tell {} apart {}: their effects on the step times are "
          "(nearly) proportional across the runs (condition number of JᵀJ {:.3g} > {:.0e}); "
          "add runs whose step time splits differently between them (other tp, node "
          "counts, models), or fit fewer parameters with --fit",
          name_list(names), when, cond, kMaxCondition));
}

struct FitOutcome {
  Vec theta;
  int iterations = 0;
  double condition = 0;
  double cost = 0;  // half the sum of squared relative residuals at theta
};

// Levenberg–Marquardt in the unbounded variables u (Marquardt's diagonal scaling; Madsen,
// Nielsen & Tingleff, "Methods for non-linear least squares problems", 2004, sec. 3.2).
FitOutcome fit(const Problem& pr, int max_iterations, bool check_start) {
  Vec theta0(static_cast<Eigen::Index>(pr.p()));
  for (std::size_t j = 0; j < pr.p(); ++j)
    theta0[static_cast<Eigen::Index>(j)] = pr.params[j]->get(pr.start);
  Vec u = pr.to_u(theta0);
  Vec theta = pr.to_theta(u);

  // Identifiability at the start: every parameter moves some run, and they move them differently.
  if (check_start) {
    const Mat J0 = pr.jacobian(theta);
    const Vec s0 = sensitivities(J0, theta, pr.params);
    for (std::size_t j = 0; j < pr.p(); ++j) {
      if (s0[static_cast<Eigen::Index>(j)] < kMinSensitivity) {
        throw InputError(
            "/runs",
            fmt::format("no run's predicted step time depends on {} at the starting values "
                        "(largest relative sensitivity {:.2g} < {:.0e}), so the runs cannot "
                        "determine it; add runs it affects, start elsewhere (--start), or leave "
                        "it out of --fit",
                        pr.params[j]->name, s0[static_cast<Eigen::Index>(j)], kMinSensitivity));
      }
    }
    (void)check_conditioning(J0, pr.params, "at the starting values");
  }

  Vec r = pr.residuals(theta);
  double cost = 0.5 * r.squaredNorm();
  double lambda = 1e-3;
  int it = 0;
  for (; it < max_iterations; ++it) {
    const Mat J = pr.jacobian(theta) * pr.dtheta_du(u).asDiagonal();
    const Mat A = J.transpose() * J;
    const Vec g = J.transpose() * r;
    if (g.lpNorm<Eigen::Infinity>() <= 1e-15) break;
    Vec d = A.diagonal().cwiseMax(1e-12 * std::max(A.diagonal().maxCoeff(), 1e-300));
    bool accepted = false;
    double gain = 0;
    Vec step;
    while (lambda < 1e16) {
      Mat M = A;
      M.diagonal() += lambda * d;
      step = M.ldlt().solve(-g);
      const Vec u_new = u + step;
      const Vec t_new = pr.to_theta(u_new);
      const Vec r_new = pr.residuals(t_new);
      const double c_new = 0.5 * r_new.squaredNorm();
      if (std::isfinite(c_new) && c_new < cost) {
        gain = cost - c_new;
        u = u_new, theta = t_new, r = r_new, cost = c_new;
        lambda = std::max(lambda / 10, 1e-12);
        accepted = true;
        break;
      }
      lambda *= 10;
    }
    if (!accepted) break;  // no step lowers the cost: a minimum (to rounding)
    // Converged: the cost fell by a relative 1e-15 or less, is zero to rounding, or u stopped.
    if (gain <= 1e-15 * (cost + gain) || cost < 1e-28 || step.lpNorm<Eigen::Infinity>() < 1e-12)
      break;
  }

  // Identifiability at the solution (a parameter can stop mattering on the way, e.g. when
  // communication ends up hidden behind compute).
  const Mat J1 = pr.jacobian(theta);
  const Vec s1 = sensitivities(J1, theta, pr.params);
  for (std::size_t j = 0; j < pr.p(); ++j) {
    if (s1[static_cast<Eigen::Index>(j)] < kMinSensitivity) {
      throw InputError("/runs",
                       fmt::format("at the fitted values no run's predicted step time depends on "
                                   "{} any more (its time is hidden), so the runs cannot determine "
                                   "it; leave it out of --fit or add runs it affects",
                                   pr.params[j]->name));
    }
  }
  const double cond = check_conditioning(J1, pr.params, "at the fitted values");
  return {theta, it, cond, cost};
}

// The step time is piecewise smooth (max() of compute and exposed communication), so a local
// method can stop in a region where a parameter's time is hidden behind another. The fit runs
// from the given start and from the middle of the bounds, and keeps the lower cost; when both
// fail, the first start's reason is the one reported.
FitOutcome fit_multistart(const Problem& pr, int max_iterations) {
  std::optional<FitOutcome> best;
  std::exception_ptr first_error;
  try {
    best = fit(pr, max_iterations, /*check_start=*/true);
  } catch (const InputError&) {
    first_error = std::current_exception();
  }
  Problem mid{pr.runs, pr.params, pr.start, pr.step};
  for (const FitParameter* f : pr.params) f->set(mid.start, 0.5 * (f->lower + f->upper));
  try {
    FitOutcome o = fit(mid, max_iterations, /*check_start=*/false);
    if (!best || o.cost < best->cost) best = std::move(o);
  } catch (const InputError&) {
    // The middle start is a second try only.
  }
  if (!best) std::rethrow_exception(first_error);
  return *best;
}

double mape(const std::vector<double>& predicted, const std::vector<const CalibrationRun*>& runs) {
  double sum = 0;
  for (std::size_t i = 0; i < runs.size(); ++i)
    sum += std::abs(predicted[i] - runs[i]->measured_step_seconds) / runs[i]->measured_step_seconds;
  return runs.empty() ? 0 : sum / static_cast<double>(runs.size());
}

std::vector<const FitParameter*> select_parameters(const std::vector<std::string>& names) {
  std::vector<const FitParameter*> out;
  for (const std::string& n : names) {
    const FitParameter* f = find_fit_parameter(n);
    if (f == nullptr) {
      std::vector<std::string> known;
      for (const FitParameter& k : kFitParameters) known.emplace_back(k.name);
      throw InputError("", fmt::format("'{}' is not a fittable assumption (fittable: {})",
                                       n.substr(0, 64), name_list(known)));
    }
    if (std::find(out.begin(), out.end(), f) != out.end())
      throw InputError("", fmt::format("'{}' is named twice in the parameters to fit", n));
    out.push_back(f);
  }
  // Table order, so results read the same whatever the order given.
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::span<const FitParameter> fit_parameters() noexcept {
  return kFitParameters;
}

const FitParameter* find_fit_parameter(std::string_view name) noexcept {
  for (const FitParameter& f : kFitParameters)
    if (f.name == name) return &f;
  return nullptr;
}

Seconds predicted_step_seconds(const StepTimeFunction& step, const Scenario& scenario,
                               const Assumptions& assumptions) {
  Scenario s = scenario;
  s.assumptions = assumptions;
  return step(s);
}

Assumptions CalibrationResult::apply(Assumptions base) const {
  for (std::size_t j = 0; j < parameters.size(); ++j)
    find_fit_parameter(parameters[j])->set(base, values[j]);
  return base;
}

CalibrationResult calibrate(const std::vector<CalibrationRun>& runs,
                            const CalibrationOptions& options) {
  DISTPLAN_CHECK(static_cast<bool>(options.step_seconds), "calibrate needs a step time function");
  const StepTimeFunction& step = options.step_seconds;
  if (runs.empty()) throw InputError("/runs", "there are no runs to fit");
  for (const CalibrationRun& r : runs) {
    if (!(r.measured_step_seconds > 0) || !std::isfinite(r.measured_step_seconds))
      throw InputError(r.measured_path, "the measured step time must be a positive number");
  }
  // Bound the work before any of it (issue 29, item 12): every evaluation plans every run.
  {
    double total = 0, largest = -1;
    const CalibrationRun* worst = nullptr;
    for (const CalibrationRun& r : runs) {
      const Scenario& s = r.scenario;
      const double passes = static_cast<double>(s.num_microbatches()) *
                            static_cast<double>(s.parallel.pp) *
                            static_cast<double>(s.parallel.virtual_stages);
      total += passes;
      if (passes > largest) largest = passes, worst = &r;
    }
    if (total > options.max_total_passes) {
      throw InputError(
          worst->path,
          fmt::format("the runs' steps have {:.0f} pipeline passes in all (micro-batches x "
                      "stages x chunks; this run {:.0f}), over the {:.0f} a calibration plans: "
                      "the fit plans every run hundreds of times. Calibrate on runs with fewer "
                      "micro-batches per step, or fewer runs",
                      total, largest, options.max_total_passes));
    }
  }
  std::vector<const CalibrationRun*> all;
  for (const CalibrationRun& r : runs) all.push_back(&r);

  CalibrationResult out;
  out.runs = static_cast<Count>(runs.size());
  std::vector<double> before;
  for (const CalibrationRun& r : runs)
    before.push_back(predicted_step_seconds(step, r.scenario, r.scenario.assumptions));
  out.mape_before = mape(before, all);

  // Fields whose 0 means "the GPU preset's" start from the runs' mean preset value.
  Assumptions start = options.start;
  for (const FitParameter& f : kFitParameters) {
    if (f.preset == nullptr || f.get(start) >= f.lower) continue;
    double sum = 0;
    for (const CalibrationRun& r : runs) sum += f.preset(r.scenario);
    f.set(start, std::clamp(sum / static_cast<double>(runs.size()), f.lower, f.upper));
  }

  // The parameters: those named, or every one the runs constrain at the starting values.
  std::vector<const FitParameter*> params;
  if (!options.parameters.empty()) {
    params = select_parameters(options.parameters);
  } else {
    for (const FitParameter& f : kFitParameters) {
      if (!f.by_default) {
        out.not_fitted.push_back({std::string(f.name), "fitted only when named (--fit)"});
        continue;
      }
      const std::vector<const FitParameter*> one{&f};
      const Problem pr{all, one, start, step};
      Vec t(1);
      t[0] = pr.to_theta(pr.to_u(Vec::Constant(1, f.get(start))))[0];
      const double s = sensitivities(pr.jacobian(t), t, one)[0];
      if (s < kMinSensitivity) {
        out.not_fitted.push_back(
            {std::string(f.name),
             fmt::format("no run's predicted step time depends on it at the starting value "
                         "(largest relative sensitivity {:.2g})",
                         s)});
      } else {
        params.push_back(&f);
      }
    }
    if (params.empty())
      throw InputError("/runs", "no fittable assumption affects the runs' predicted step times");
  }
  if (runs.size() < params.size()) {
    std::vector<std::string> names;
    for (const FitParameter* f : params) names.emplace_back(f->name);
    throw InputError("/runs",
                     fmt::format("{} run{} cannot determine {} parameters ({}); give at least {} "
                                 "runs or fit fewer parameters with --fit",
                                 runs.size(), runs.size() == 1 ? "" : "s", params.size(),
                                 name_list(names), params.size()));
  }

  const Problem pr{all, params, start, step};
  const FitOutcome f = fit_multistart(pr, options.max_iterations);
  out.iterations = f.iterations;
  out.condition_number = f.condition;
  for (std::size_t j = 0; j < params.size(); ++j) {
    const double v = f.theta[static_cast<Eigen::Index>(j)];
    out.parameters.emplace_back(params[j]->name);
    out.values.push_back(v);
    const double span = params[j]->upper - params[j]->lower;
    if (v - params[j]->lower <= kAtBound * span || params[j]->upper - v <= kAtBound * span)
      out.at_bound.emplace_back(params[j]->name);
  }
  std::vector<double> after;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    after.push_back(predicted_step_seconds(step, runs[i].scenario, pr.at(runs[i], f.theta)));
    out.run_fits.push_back({runs[i].measured_step_seconds, before[i], after[i], std::nullopt});
  }
  out.mape_after = mape(after, all);

  // Leave-one-out: refit the same parameters without run i (from the full fit), predict run i.
  if (!options.leave_one_out) {
    out.leave_one_out_note = "not computed";
  } else if (runs.size() > options.max_leave_one_out_runs) {
    out.leave_one_out_note =
        fmt::format("not computed for more than {} runs", options.max_leave_one_out_runs);
  } else if (runs.size() < params.size() + 1) {
    out.leave_one_out_note =
        fmt::format("needs at least {} runs (one more than the parameters)", params.size() + 1);
  } else {
    double sum = 0;
    bool ok = true;
    for (std::size_t i = 0; i < runs.size() && ok; ++i) {
      std::vector<const CalibrationRun*> rest;
      for (std::size_t k = 0; k < runs.size(); ++k)
        if (k != i) rest.push_back(all[k]);
      Assumptions from_full = start;
      for (std::size_t j = 0; j < params.size(); ++j)
        params[j]->set(from_full, f.theta[static_cast<Eigen::Index>(j)]);
      const Problem fold{rest, params, from_full, step};
      try {
        const FitOutcome g = fit(fold, options.max_iterations, /*check_start=*/false);
        const double pred =
            predicted_step_seconds(step, runs[i].scenario, fold.at(runs[i], g.theta));
        out.run_fits[i].predicted_leave_one_out = pred;
        sum += std::abs(pred - runs[i].measured_step_seconds) / runs[i].measured_step_seconds;
      } catch (const InputError& e) {
        ok = false;
        out.leave_one_out_note =
            fmt::format("without {} the rest cannot be fitted: {}", runs[i].path, e.what());
      }
    }
    if (ok) {
      out.leave_one_out_mape = sum / static_cast<double>(runs.size());
    } else {
      for (RunFit& r : out.run_fits) r.predicted_leave_one_out.reset();
    }
  }
  return out;
}

}  // namespace distplan
