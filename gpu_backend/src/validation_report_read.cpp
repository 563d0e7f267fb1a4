// Reading a distplan.validate/v1 document back into the typed report (validation_report.h,
// validation_report_from_json): every front end reads the report `distplan validate` printed,
// none re-derives the figures. The plan is recomputed from the document's scenario and held
// against its predicted figures.
#include <cmath>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/error.h"
#include "distplan/planner/object_reader.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "validation_report_json.h"

namespace distplan::backend {
namespace {

using detail::ObjectReader;
using nlohmann::json;

constexpr const char* kSchema = "distplan.validate/v1";
constexpr double kMaxNumber = std::numeric_limits<double>::max();

// A recomputed figure may differ from the written one in its last bits when another build (a
// CUDA host's compiler flags, FMA contraction) wrote the file: floating-point figures agree to
// this relative tolerance, integers exactly. Anything wider is another plan.
constexpr double kRecomputedRelativeTolerance = 1e-12;

[[noreturn]] void stale(const std::string& path, const std::string& what) {
  throw InputError(path, what +
                             ": the predicted figures are recomputed from /scenario by this "
                             "distplan's planner and differ (a result of another distplan version, "
                             "or an edited file)");
}

bool same_number(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer()) return a == b;
  const double x = a.get<double>(), y = b.get<double>();
  return x == y ||
         std::abs(x - y) <= kRecomputedRelativeTolerance * std::max(std::abs(x), std::abs(y));
}

// Throws at the first place where `written` (the document, at `path`) differs from `expected`
// (recomputed).
void expect_recomputed(const json& expected, const json& written, const std::string& path) {
  if (expected.is_number() && written.is_number()) {
    if (!same_number(expected, written))
      stale(path, fmt::format("is {}, the plan gives {}", written.dump(), expected.dump()));
    return;
  }
  if (expected.type() != written.type()) {
    stale(path, fmt::format("is {}, the plan gives {}", detail::json_type_name(written),
                            detail::json_type_name(expected)));
  }
  if (expected.is_object()) {
    for (auto it = written.begin(); it != written.end(); ++it)
      if (!expected.contains(it.key()))
        throw InputError(path + "/" + detail::pointer_escape(it.key()),
                         fmt::format("unknown field {}", json(it.key()).dump()));
    for (auto it = expected.begin(); it != expected.end(); ++it) {
      const std::string p = path + "/" + detail::pointer_escape(it.key());
      if (!written.contains(it.key())) throw InputError(p, it.key() + " is required");
      expect_recomputed(it.value(), written.at(it.key()), p);
    }
  } else if (expected.is_array()) {
    if (expected.size() != written.size())
      stale(path, fmt::format("has {} entries, the plan {}", written.size(), expected.size()));
    for (std::size_t i = 0; i < expected.size(); ++i)
      expect_recomputed(expected[i], written[i], path + "/" + std::to_string(i));
  } else if (expected != written) {
    stale(path, fmt::format("is {}, the plan gives {}", written.dump(), expected.dump()));
  }
}

const json& required(ObjectReader& rd, std::string_view key) {
  const json* v = rd.take(key);
  if (v == nullptr) rd.missing(key, fmt::format("{} is required ({})", key, kSchema));
  return *v;
}

const json& array_field(ObjectReader& rd, std::string_view key) {
  const json& v = required(rd, key);
  if (!v.is_array())
    throw InputError(rd.child(key),
                     fmt::format("{} must be an array, not {}", key, detail::json_type_name(v)));
  return v;
}

Count count_field(ObjectReader& rd, std::string_view key, Count min = 0,
                  Count max = std::numeric_limits<Count>::max()) {
  const auto v = rd.integer(key, min, max);
  if (!v) rd.missing(key, fmt::format("{} is required ({})", key, kSchema));
  return *v;
}

double number_field(ObjectReader& rd, std::string_view key, double min = -kMaxNumber) {
  const auto v = rd.number(key, min, kMaxNumber, false);
  if (!v) rd.missing(key, fmt::format("{} is required ({})", key, kSchema));
  return *v;
}

std::string string_field(ObjectReader& rd, std::string_view key) {
  const auto v = rd.string(key);
  if (!v) rd.missing(key, fmt::format("{} is required ({})", key, kSchema));
  return *v;
}

// A relative error: a number, or null where there is no prediction to compare with.
RelativeError error_field(ObjectReader& rd, std::string_view key) {
  const json& v = required(rd, key);
  if (v.is_null()) return std::nullopt;
  return rd.number(key, -kMaxNumber, kMaxNumber, false);
}

// The stage of a per-stage entry: a stage of the layout, after the previous entry's.
int stage_field(ObjectReader& rd, const Scenario& s, int previous) {
  const Count st = count_field(rd, "stage", 0, s.parallel.pp - 1);
  if (st <= previous)
    throw InputError(
        rd.child("stage"),
        fmt::format("stage {} follows stage {}: stages are listed once, in order", st, previous));
  return static_cast<int>(st);
}

// Every per-stage list of a side names the same stages as the measured memory.
void expect_stage(int stage, int expected, const std::string& path) {
  if (stage != expected)
    throw InputError(
        path + "/stage",
        fmt::format("stage {}, where the measured memory's entry is stage {}", stage, expected));
}

template <class F>
void each(const json& list, const std::string& path, F&& f) {
  for (std::size_t i = 0; i < list.size(); ++i) f(list[i], path + "/" + std::to_string(i), i);
}

// Each entry of a per-stage list, read as an object whose stage follows the previous entry's:
// f(reader, stage, entry, path) reads the rest, then every key must have been read.
template <class F>
void each_stage(const json& list, const std::string& path, const Scenario& s, F&& f) {
  int previous = -1;
  each(list, path, [&](const json& x, const std::string& p, std::size_t) {
    ObjectReader sr(x, p);
    previous = stage_field(sr, s, previous);
    f(sr, previous, x);
    sr.finish();
  });
}

StageCollectives read_measured_collectives(const json& j, const std::string& path,
                                           const Scenario& s, int previous) {
  ObjectReader rd(j, path);
  StageCollectives c;
  c.stage = stage_field(rd, s, previous);
  c.wire_bytes_per_gpu_per_step = count_field(rd, "wire_bytes_per_gpu_per_step");
  each(array_field(rd, "collectives"), rd.child("collectives"),
       [&](const json& x, const std::string& p, std::size_t) {
         ObjectReader cr(x, p);
         CollectiveSum sum;
         sum.group = string_field(cr, "group");
         sum.op = string_field(cr, "op");
         sum.what = string_field(cr, "what");
         sum.bytes_per_step = count_field(cr, "bytes_per_step");
         sum.calls_per_step = count_field(cr, "calls_per_step");
         cr.finish();
         c.collectives.push_back(std::move(sum));
       });
  rd.finish();
  sum_by_op(c);
  return c;
}

// /predicted: the plan's memory, communication and time, recomputed and held against the
// document; per measured stage the planned collectives; the simulator with the measured costs.
void read_predicted(const json& j, ValidationReport& r) {
  const Scenario& s = r.scenario;
  ObjectReader pr(j, "/predicted");
  const json plan = plan_to_json(s, r.estimate, plan_memory | plan_communication | plan_time);
  expect_recomputed(plan.at("memory"), required(pr, "memory"), pr.child("memory"));
  const json& comm = required(pr, "communication");
  const json& time = required(pr, "time");
  pr.finish();
  if (!r.fits) {
    expect_recomputed(plan.at("communication"), comm, "/predicted/communication");
    expect_recomputed(plan.at("time"), time, "/predicted/time");
    return;
  }
  ObjectReader cr(comm, "/predicted/communication");
  const json& stages = array_field(cr, "stages");
  json rest = comm;
  rest.erase("stages");
  expect_recomputed(plan.at("communication"), rest, cr.path());
  int previous = -1;
  each(stages, cr.child("stages"), [&](const json& x, const std::string& p, std::size_t) {
    ObjectReader sr(x, p);
    const int st = stage_field(sr, s, previous);
    previous = st;
    StageCollectives planned = planned_collectives(s, st);
    expect_recomputed(stage_collectives_json(planned), x, p);
    r.predicted_collectives.push_back(std::move(planned));
  });

  ObjectReader tr(time, "/predicted/time");
  ObjectReader costs(required(tr, "costs"), tr.child("costs"));
  r.costs.forward_seconds = number_field(costs, "forward_seconds", 0);
  r.costs.backward_seconds = number_field(costs, "backward_seconds", 0);
  if (!required(costs, "backward_weight_seconds").is_null())
    r.costs.backward_weight_seconds = number_field(costs, "backward_weight_seconds", 0);
  costs.finish();
  const sim::SimResult sr = simulate_with_measured_costs(s, r.estimate, r.costs);
  r.simulated_step_seconds = sr.step_seconds;
  r.simulated_bubble_fraction = sr.bubble_fraction;
  expect_recomputed(sr.step_seconds, required(tr, "simulated_step_seconds"),
                    tr.child("simulated_step_seconds"));
  expect_recomputed(sr.bubble_fraction, required(tr, "simulated_bubble_fraction"),
                    tr.child("simulated_bubble_fraction"));
  json plan_time = time;
  for (const char* k : {"costs", "simulated_step_seconds", "simulated_bubble_fraction"})
    plan_time.erase(k);
  expect_recomputed(plan.at("time"), plan_time, tr.path());
}

// /measured (the run fitted).
void read_measured(ObjectReader& mr, ObjectReader& mm, ValidationReport& r) {
  const Scenario& s = r.scenario;
  expect_recomputed(r.estimate.memory.capacity_bytes, required(mm, "capacity_bytes"),
                    mm.child("capacity_bytes"));
  r.peak_bytes = count_field(mm, "peak_bytes");
  each_stage(array_field(mm, "stages"), mm.child("stages"), s,
             [&](ObjectReader& sr, int stage, const json&) {
               StageMemoryMeasured ms;
               ms.stage = stage;
               for (const char* c : kMeasuredCategories)
                 ms.bytes[c] = count_field(sr, std::string(c) + "_bytes");
               r.memory.push_back(std::move(ms));
             });
  mm.finish();

  ObjectReader cr(required(mr, "communication"), "/measured/communication");
  r.busiest_wire_bytes = count_field(cr, "wire_bytes_per_gpu_per_step");
  int previous = -1;
  each(array_field(cr, "stages"), cr.child("stages"),
       [&](const json& x, const std::string& p, std::size_t) {
         r.measured_collectives.push_back(read_measured_collectives(x, p, s, previous));
         previous = r.measured_collectives.back().stage;
       });
  cr.finish();

  ObjectReader tr(required(mr, "time"), "/measured/time");
  r.time.step_seconds = number_field(tr, "step_seconds", 0);
  r.time.compute_seconds = number_field(tr, "compute_seconds", 0);
  r.time.bubble_fraction = number_field(tr, "bubble_fraction");
  r.time.optimizer_seconds = number_field(tr, "optimizer_seconds", 0);
  tr.finish();
  mr.finish();
}

// /relative_error (the run fitted).
void read_errors(const json& j, ValidationReport& r) {
  const Scenario& s = r.scenario;
  ObjectReader er(j, "/relative_error");
  ObjectReader mem(required(er, "memory"), er.child("memory"));
  r.peak_error = error_field(mem, "peak_bytes");
  each_stage(array_field(mem, "stages"), mem.child("stages"), s,
             [&](ObjectReader& sr, int stage, const json&) {
               StageMemoryError es;
               es.stage = stage;
               for (const char* c : kComparedCategories)
                 es.by_category[c] = error_field(sr, std::string(c) + "_bytes");
               r.memory_error.push_back(std::move(es));
             });
  mem.finish();

  ObjectReader comm(required(er, "communication"), er.child("communication"));
  each_stage(array_field(comm, "stages"), comm.child("stages"), s,
             [&](ObjectReader& sr, int stage, const json& x) {
               StageCollectivesError ec;
               ec.stage = stage;
               ec.wire_bytes_per_gpu_per_step = error_field(sr, "wire_bytes_per_gpu_per_step");
               ObjectReader ops(required(sr, "collectives"), sr.child("collectives"));
               for (auto it = x.at("collectives").begin(); it != x.at("collectives").end(); ++it)
                 ec.by_op[it.key()] = error_field(ops, it.key());
               ops.finish();
               r.collectives_error.push_back(std::move(ec));
             });
  comm.finish();

  ObjectReader time(required(er, "time"), er.child("time"));
  r.simulated_step_error = error_field(time, "simulated_step_seconds");
  if (time.has("bubble_fraction")) r.bubble_error = error_field(time, "bubble_fraction");
  if (time.has("step_seconds")) r.step_error = error_field(time, "step_seconds");
  time.finish();
  er.finish();
}

// The per-stage lists of one report name the same stages, entry by entry.
void check_stages_agree(const ValidationReport& r) {
  if (r.memory_error.size() != r.memory.size())
    throw InputError("/relative_error/memory/stages",
                     fmt::format("{} entries, where the measured memory has {}",
                                 r.memory_error.size(), r.memory.size()));
  for (std::size_t i = 0; i < r.memory.size(); ++i)
    expect_stage(r.memory_error[i].stage, r.memory[i].stage,
                 "/relative_error/memory/stages/" + std::to_string(i));
  const std::size_t n = r.measured_collectives.size();
  if (r.predicted_collectives.size() != n)
    throw InputError("/predicted/communication/stages",
                     fmt::format("{} entries, where the measured communication has {}",
                                 r.predicted_collectives.size(), n));
  if (r.collectives_error.size() != n)
    throw InputError("/relative_error/communication/stages",
                     fmt::format("{} entries, where the measured communication has {}",
                                 r.collectives_error.size(), n));
  for (std::size_t i = 0; i < n; ++i) {
    const int st = r.measured_collectives[i].stage;
    expect_stage(r.predicted_collectives[i].stage, st,
                 "/predicted/communication/stages/" + std::to_string(i));
    expect_stage(r.collectives_error[i].stage, st,
                 "/relative_error/communication/stages/" + std::to_string(i));
  }
}

}  // namespace

ValidationReport validation_report_from_json(const json& doc) {
  ObjectReader top(doc, "");
  const std::string schema = string_field(top, "schema");
  if (schema != kSchema)
    throw InputError("/schema", fmt::format("schema '{}' is not {}", schema, kSchema));
  ValidationReport r;
  try {
    r.scenario = scenario_from_json(required(top, "scenario"));
  } catch (const InputError& e) {
    throw InputError("/scenario" + e.path(), e.what());
  }
  r.estimate = sim::plan(r.scenario);
  r.ranks = ranks_of(r.scenario);
  r.settings.device = string_field(top, "device");
  if (r.settings.device != "cpu" && r.settings.device != "cuda")
    throw InputError("/device", fmt::format("device '{}' is not cpu or cuda", r.settings.device));
  r.settings.steps = count_field(top, "steps", 1);
  const json& losses = array_field(top, "losses");

  ObjectReader mr(required(top, "measured"), "/measured");
  ObjectReader mm(required(mr, "memory"), "/measured/memory");
  const std::optional<bool> fits = mm.boolean("fits");
  if (!fits) mm.missing("fits", "fits is required (false: the run ran out of memory)");
  r.fits = *fits;
  if (!r.fits) {
    // Out of memory: the message, the plan, and whether the plan expected it.
    r.oom_message = string_field(mm, "message");
    mm.finish();
    mr.finish();
    read_predicted(required(top, "predicted"), r);
    ObjectReader er(required(top, "relative_error"), "/relative_error");
    ObjectReader em(required(er, "memory"), er.child("memory"));
    expect_recomputed(r.estimate.memory.fits ? 1.0 : 0.0, required(em, "fits"), em.child("fits"));
    em.finish();
    er.finish();
    if (!losses.empty()) throw InputError("/losses", "a run that did not fit has no losses");
    top.finish();
    return r;
  }
  r.in_gib = memory_in_gib(r.scenario, r.estimate);
  expect_recomputed(r.ranks, required(top, "ranks"), "/ranks");
  if (!required(top, "emulate_rank").is_null())
    r.settings.emulate_rank = static_cast<int>(count_field(top, "emulate_rank", 0, r.ranks - 1));
  read_measured(mr, mm, r);
  read_predicted(required(top, "predicted"), r);
  read_errors(required(top, "relative_error"), r);
  check_stages_agree(r);
  // A loss that was not a number (a diverged step) is written as null.
  each(losses, "/losses", [&](const json& x, const std::string& p, std::size_t) {
    if (!x.is_number() && !x.is_null())
      throw InputError(
          p, fmt::format("a loss must be a number or null, not {}", detail::json_type_name(x)));
    r.losses.push_back(x.is_null() ? std::numeric_limits<double>::quiet_NaN() : x.get<double>());
  });
  each(array_field(top, "skipped_steps"), "/skipped_steps",
       [&](const json& x, const std::string& p, std::size_t) {
         if (!x.is_boolean())
           throw InputError(p, fmt::format("a skipped-step flag must be a boolean, not {}",
                                           detail::json_type_name(x)));
         r.skipped.push_back(x.get<bool>());
       });
  if (r.skipped.size() != r.losses.size())
    throw InputError("/skipped_steps", fmt::format("{} flags for {} losses: one per step",
                                                   r.skipped.size(), r.losses.size()));
  top.finish();
  return r;
}

}  // namespace distplan::backend
