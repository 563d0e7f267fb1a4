#include "distplan/search/search_json.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/capabilities.h"
#include "distplan/planner/error.h"
#include "distplan/planner/interval.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/suggest.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {

using nlohmann::json;

namespace {

constexpr Count kMaxCount = Count{1} << 40;

std::string type_name(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

Count read_int(const json& v, const std::string& path, Count min, Count max) {
  if (v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                v.get<double>() == std::floor(v.get<double>()))) {
    const double d = v.get<double>();
    if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
      throw InputError(path, fmt::format("must be between {} and {}", min, max));
    }
    return v.is_number_integer() ? v.get<Count>() : static_cast<Count>(d);
  }
  throw InputError(path, fmt::format("must be an integer, not {}", type_name(v)));
}

double read_number(const json& v, const std::string& path, double min, double max) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    throw InputError(path, fmt::format("must be a number, not {}", type_name(v)));
  }
  const double d = v.get<double>();
  if (d < min || d > max)
    throw InputError(path, fmt::format("must be between {} and {}", min, max));
  return d;
}

bool read_bool(const json& v, const std::string& path) {
  if (!v.is_boolean())
    throw InputError(path, fmt::format("must be a boolean, not {}", type_name(v)));
  return v.get<bool>();
}

template <class E>
E read_enum(const json& v, const std::string& path, std::initializer_list<E> values) {
  if (!v.is_string()) throw InputError(path, fmt::format("must be a string, not {}", type_name(v)));
  const std::string s = v.get<std::string>();
  std::string names;
  for (E e : values) {
    if (to_string(e) == s) return e;
    names += (names.empty() ? "" : ", ") + std::string(to_string(e));
  }
  throw InputError(path, fmt::format("'{}' is not one of: {}", s.substr(0, 64), names));
}

/// A scalar or a non-empty list of scalars, each read by `one`; sorted and deduplicated.
template <class T, class F>
std::vector<T> read_list(const json& v, const std::string& path, F&& one) {
  std::vector<T> out;
  if (v.is_array()) {
    if (v.empty()) throw InputError(path, "a list of candidates must not be empty");
    for (std::size_t i = 0; i < v.size(); ++i) {
      out.push_back(one(v[i], path + "/" + std::to_string(i)));
    }
  } else {
    out.push_back(one(v, path));
  }
  // First occurrences in order, O(n log n): a list of a million values dedupes in well under a
  // second (a linear scan per value was quadratic).
  std::vector<T> unique;
  std::set<T> seen;
  for (const T& x : out) {
    if (seen.insert(x).second) unique.push_back(x);
  }
  return unique;
}

std::vector<Count> int_list(const json& v, const std::string& path, Count min, Count max) {
  auto out = read_list<Count>(
      v, path, [&](const json& x, const std::string& p) { return read_int(x, p, min, max); });
  std::sort(out.begin(), out.end());
  return out;
}

void unknown_key(const std::string& path, const std::string& key,
                 const std::vector<std::string>& known) {
  std::string printable;
  for (char c : key.substr(0, 64)) printable += (c >= 0x20 && c < 0x7f) ? c : '?';
  throw InputError(path + "/" + key,
                   fmt::format("unknown field '{}'{}", printable, did_you_mean(key, known)));
}

// Settings every searched layout keeps (one value each, not a list): the context-parallel
// exchange and ZeRO offload.
struct FixedParallel {
  CpComm cp_comm = CpComm::p2p;
  Offload offload_optimizer = Offload::none;
  Offload offload_params = Offload::none;
};

Candidates read_parallel(const json& p, FixedParallel& fixed) {
  if (!p.is_object()) {
    throw InputError("/parallel", fmt::format("must be an object, not {}", type_name(p)));
  }
  Candidates c;
  for (const auto& [key, v] : p.items()) {
    const std::string path = "/parallel/" + key;
    if (key == "tp") {
      c.tp = int_list(v, path, 1, kMaxCount);
    } else if (key == "pp") {
      c.pp = int_list(v, path, 1, kMaxCount);
    } else if (key == "cp") {
      c.cp = int_list(v, path, 1, kMaxCount);
    } else if (key == "ep") {
      c.ep = int_list(v, path, 1, kMaxCount);
    } else if (key == "etp") {
      c.etp = int_list(v, path, 1, kMaxCount);
    } else if (key == "cp_comm") {
      fixed.cp_comm = read_enum(v, path, {CpComm::p2p, CpComm::all_gather, CpComm::a2a});
    } else if (key == "offload_optimizer" || key == "offload_params") {
      (key == "offload_optimizer" ? fixed.offload_optimizer : fixed.offload_params) =
          read_enum(v, path, {Offload::none, Offload::cpu, Offload::nvme});
    } else if (key == "dp") {
      c.dp = int_list(v, path, 1, kMaxCount);
    } else if (key == "virtual_stages") {
      c.virtual_stages = int_list(v, path, 1, kMaxCount);
    } else if (key == "fsdp_shard_size") {
      c.fsdp_shard_size = int_list(v, path, 0, kMaxCount);
    } else if (key == "zero_stage") {
      for (Count z : int_list(v, path, 0, 3)) c.zero_stage.push_back(static_cast<int>(z));
    } else if (key == "sequence_parallel") {
      c.sequence_parallel = read_list<bool>(v, path, read_bool);
    } else if (key == "recompute") {
      c.recompute = read_list<Recompute>(v, path, [](const json& x, const std::string& q) {
        return read_enum(
            x, q,
            {Recompute::none, Recompute::selective, Recompute::full, Recompute::selective_op});
      });
    } else if (key == "schedule") {
      c.schedule = read_list<Schedule>(v, path, [](const json& x, const std::string& q) {
        return read_enum(
            x, q,
            {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved_1f1b, Schedule::zb_h1,
             Schedule::zb_h2, Schedule::zb_v, Schedule::v_half, Schedule::v_min,
             Schedule::dualpipe_v, Schedule::dualpipe, Schedule::zb_auto});
      });
    } else if (key == "split") {
      c.split = read_list<SplitChoice>(v, path, [](const json& x, const std::string& q) {
        return read_enum(x, q, {SplitChoice::even, SplitChoice::light_ends});
      });
    } else if (key == "layers_per_stage" || key == "layers_per_virtual_stage" ||
               key == "pipeline_split") {
      throw InputError(path,
                       "the search chooses each layout's split (even or light_ends; pin "
                       "them with \"split\"); omit " +
                           key);
    } else {
      unknown_key("/parallel", key,
                  {"tp", "pp", "dp", "cp", "ep", "etp", "virtual_stages", "fsdp_shard_size",
                   "zero_stage", "sequence_parallel", "recompute", "schedule", "split", "cp_comm",
                   "offload_optimizer", "offload_params"});
    }
  }
  return c;
}

struct ConstraintField {
  const char* name;
  bool Constraints::*field;
  const char* meaning;
};
constexpr ConstraintField kConstraintFields[] = {
    {"tp_within_node", &Constraints::tp_within_node, "tp <= gpus_per_node and divides it"},
    {"pp_divides_layers", &Constraints::pp_divides_layers, "pp divides num_layers"},
    {"sequence_parallel_needs_tp", &Constraints::sequence_parallel_needs_tp,
     "sequence parallelism only with tp > 1"},
    {"zero_needs_dp", &Constraints::zero_needs_dp, "ZeRO stages 1-3 only with dp > 1"},
    {"single_schedule_without_pp", &Constraints::single_schedule_without_pp,
     "one schedule at pp = 1"},
    {"interleaved_needs_pp", &Constraints::interleaved_needs_pp, "interleaving only with pp > 1"},
    {"hybrid_shard", &Constraints::hybrid_shard, "also try ZeRO shard groups smaller than dp"},
    {"whole_nodes", &Constraints::whole_nodes,
     "objective gpus: GPU counts within one node or in whole nodes"},
};

Constraints read_constraints(const json& v) {
  const std::string path = "/search/constraints";
  if (!v.is_object())
    throw InputError(path, fmt::format("must be an object, not {}", type_name(v)));
  Constraints c;
  for (const auto& [key, value] : v.items()) {
    bool found = false;
    if (key == "max_micro_batch_size") {
      c.max_micro_batch_size = read_int(value, path + "/" + key, 0, kMaxCount);
      found = true;
    }
    if (key == "min_tokens_per_cp_rank") {
      c.min_tokens_per_cp_rank = read_int(value, path + "/" + key, 0, kMaxCount);
      found = true;
    }
    for (const auto& f : kConstraintFields) {
      if (key == f.name) {
        c.*f.field = read_bool(value, path + "/" + key);
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> known{"max_micro_batch_size", "min_tokens_per_cp_rank"};
      for (const auto& f : kConstraintFields) known.emplace_back(f.name);
      unknown_key(path, key, known);
    }
  }
  return c;
}

void read_search(const json& v, Request& r) {
  if (!v.is_object()) {
    throw InputError("/search", fmt::format("must be an object, not {}", type_name(v)));
  }
  bool has_target = false;
  for (const auto& [key, value] : v.items()) {
    const std::string path = "/search/" + key;
    if (key == "top_k") {
      r.options.top_k = static_cast<int>(read_int(value, path, 1, kMaxTopK));
    } else if (key == "objective") {
      r.options.objective =
          read_enum(value, path, {Objective::throughput, Objective::memory, Objective::gpus});
    } else if (key == "memory_margin") {
      r.options.memory_margin = read_number(value, path, 0.0, 0.99);
    } else if (key == "simulate_top" || key == "simulate_within") {
      throw InputError(path,
                       "is no longer an option: every plan the search ranks is timed by the "
                       "schedule walk, the search walks candidates in order of a lower bound "
                       "until none can enter the best (docs/search.md); remove the field");
    } else if (key == "target_tokens_per_second") {
      r.options.target_tokens_per_second = read_number(value, path, 0.0, 1e18);
      has_target = true;
    } else if (key == "threads") {
      r.options.threads = static_cast<int>(read_int(value, path, 0, kMaxThreads));
    } else if (key == "suggest") {
      r.options.suggest = read_bool(value, path);
    } else if (key == "constraints") {
      r.space.constraints = read_constraints(value);
    } else {
      unknown_key("/search", key,
                  {"top_k", "objective", "memory_margin", "target_tokens_per_second", "threads",
                   "suggest", "constraints"});
    }
  }
  if (r.options.objective == Objective::gpus && !has_target) {
    throw InputError("/search/target_tokens_per_second",
                     "objective 'gpus' needs a target_tokens_per_second");
  }
  r.space.fewer_gpus = r.options.objective == Objective::gpus;
}

}  // namespace

Request request_from_json(const json& doc, const ScenarioParser& parse_scenario) {
  if (!doc.is_object()) throw InputError("", "the search input must be a JSON object");
  Request r;
  json base = doc;
  base.erase("search");

  // The searched dimensions are read here; the rest of the scenario by the planner's reader,
  // on a document whose layout is a placeholder every valid cluster accepts: tp = pp = 1,
  // dp = num_gpus, one sequence per GPU per step.
  FixedParallel fixed;
  if (doc.contains("parallel")) r.space.candidates = read_parallel(doc.at("parallel"), fixed);
  base["parallel"] = json{{"tp", 1}, {"pp", 1}};

  std::optional<Count> global_batch;
  if (doc.contains("training") && doc.at("training").is_object()) {
    const json& t = doc.at("training");
    if (t.contains("micro_batch_size")) {
      r.space.candidates.micro_batch_size =
          int_list(t.at("micro_batch_size"), "/training/micro_batch_size", 1, kMaxCount);
    }
    if (t.contains("global_batch_size")) {
      global_batch =
          read_int(t.at("global_batch_size"), "/training/global_batch_size", 1, kMaxCount);
    }
    base["training"]["micro_batch_size"] = 1;
    if (global_batch && doc.contains("cluster") && doc.at("cluster").is_object() &&
        doc.at("cluster").contains("num_gpus") &&
        doc.at("cluster").at("num_gpus").is_number_integer() &&
        doc.at("cluster").at("num_gpus").get<Count>() > 0) {
      base["training"]["global_batch_size"] = doc.at("cluster").at("num_gpus").get<Count>();
    }
  }
  const bool has_gpus = doc.contains("cluster") && doc.at("cluster").is_object() &&
                        doc.at("cluster").contains("num_gpus");
  r.space.base = parse_scenario ? parse_scenario(base) : scenario_from_json(base, {"search"});
  if (!has_gpus) {
    throw InputError("/cluster/num_gpus", "the search needs num_gpus (the GPUs to lay out)");
  }
  if (global_batch) r.space.base.training.global_batch_size = *global_batch;
  r.space.base.parallel = ParallelSpec{};
  r.space.base.parallel.cp_comm = fixed.cp_comm;
  r.space.base.parallel.offload_optimizer = fixed.offload_optimizer;
  r.space.base.parallel.offload_params = fixed.offload_params;
  // An offload the framework cannot run is refused at its field rather than cut from every
  // layout (docs/frameworks.md).
  const FrameworkCapabilities& caps = capabilities(r.space.base.training.framework);
  auto refuse = [&](const Support& row, const char* path, const std::string& what) {
    if (row.runs) return;
    const FrameworkRefusal f = refusal(caps, row, path, what);
    throw InputError(f.path, f.message);
  };
  refuse(caps.offload_optimizer[static_cast<std::size_t>(fixed.offload_optimizer)],
         "/parallel/offload_optimizer",
         fmt::format("optimizer offload to {}", to_string(fixed.offload_optimizer)));
  refuse(caps.offload_params[static_cast<std::size_t>(fixed.offload_params)],
         "/parallel/offload_params",
         fmt::format("parameter offload to {}", to_string(fixed.offload_params)));
  if (fixed.offload_optimizer != Offload::none && fixed.offload_params == Offload::none)
    refuse(caps.offload_optimizer_alone, "/parallel/offload_params",
           "optimizer offload with the parameters on the GPU");

  if (doc.contains("search")) read_search(doc.at("search"), r);
  return r;
}

json layout_to_json(const Layout& l) {
  return to_json(parallel_of(l));
}

namespace {

json figures_to_json(const Figures& f) {
  return {{"peak_bytes", f.peak_bytes},
          {"capacity_bytes", f.capacity_bytes},
          {"step_seconds", f.step_seconds},
          {"tokens_per_second", f.tokens_per_second},
          {"mfu", f.mfu}};
}

// What every face plans with (docs/time.md, "One timing engine"): the intervals' residuals are
// the schedule walk's.
PlanFunction walk() {
  return [](const Scenario& x) { return sim::plan(x); };
}

// Each plan carries its whole scenario (the base with its layout, every default filled in), so
// re-planning, simulating or exporting it needs no merging by hand.
json plan_to_json_entry(const Scenario& base, const Plan& p, int rank) {
  const Scenario s = make_scenario(base, p.layout);
  // The corpus residuals of this kind of run (docs/fidelity.md, "Prediction intervals").
  const ThroughputInterval ti = throughput_interval(s, p.figures.tokens_per_second, walk());
  json j = {{"parallel", to_json(s.parallel)},
            {"micro_batch_size", p.layout.micro_batch_size},
            {"num_gpus", p.layout.num_gpus()},
            {"peak_bytes", p.figures.peak_bytes},
            {"capacity_bytes", p.figures.capacity_bytes},
            {"step_seconds", p.figures.step_seconds},
            {"tokens_per_second", p.figures.tokens_per_second},
            {"tokens_per_second_interval", interval_to_json(ti)},
            {"mfu", p.figures.mfu},
            {"bubble_fraction", p.bubble_fraction},
            {"bound", figures_to_json(p.bound)},
            {"scenario", to_json(s)}};
  if (rank > 0) j["rank"] = rank;
  return j;
}

json constraints_to_json(const Constraints& c) {
  json j = json::object();
  for (const auto& f : kConstraintFields) j[f.name] = c.*f.field;
  j["max_micro_batch_size"] = c.max_micro_batch_size;
  j["min_tokens_per_cp_rank"] = c.min_tokens_per_cp_rank;
  return j;
}

}  // namespace

json result_to_json(const Request& req, const Result& r) {
  json rejected = json::object();
  for (int i = 0; i < kNumRejects; ++i) {
    if (r.rejected[i] > 0) rejected[std::string(to_string(static_cast<Reject>(i)))] = r.rejected[i];
  }
  json plans = json::array();
  int rank = 1;
  for (const Plan& p : r.plans) plans.push_back(plan_to_json_entry(req.space.base, p, rank++));
  json scenario = to_json(req.space.base);
  scenario.erase("parallel");
  json j = {{"schema", "distplan.search/v1"},
            {"scenario", scenario},
            {"objective", std::string(to_string(r.objective))},
            {"memory_margin", req.options.memory_margin},
            {"constraints", constraints_to_json(req.space.constraints)},
            {"evaluated", r.evaluated},
            {"feasible", r.feasible},
            {"pruned", r.pruned},
            {"seconds", r.seconds},
            {"evaluate_seconds", r.evaluate_seconds},
            {"layouts_per_second",
             r.evaluate_seconds > 0 ? static_cast<double>(r.evaluated) / r.evaluate_seconds : 0.0},
            {"threads", r.threads},
            {"walked", r.walked},
            {"quiet_walks", r.quiet_walks},
            {"rejected", rejected},
            {"plans", plans}};
  if (r.objective == Objective::gpus) {
    j["target_tokens_per_second"] = req.options.target_tokens_per_second;
  }
  if (r.plans.empty()) {
    std::string why;
    if (r.evaluated == 0) {
      why = "no layout satisfies the constraints and pins (see rejected)";
    } else if (r.objective == Objective::gpus &&
               r.rejected[static_cast<int>(Reject::below_target)] > 0) {
      why = "layouts fit in memory, but none reaches the target throughput";
    } else {
      why = "no layout fits in memory";
    }
    j["answer"] = why;
    j["closest"] = r.closest ? plan_to_json_entry(req.space.base, *r.closest, 0) : json(nullptr);
    json sugg = json::array();
    for (const Suggestion& s : r.suggestions) {
      sugg.push_back(
          {{"change", s.change}, {"detail", s.detail}, {"value", s.value}, {"fits", s.fits}});
    }
    j["suggestions"] = sugg;
  }
  return j;
}

std::string format_result_table(const Request& req, const Result& r) {
  std::ostringstream o;
  const Scenario& b = req.space.base;
  o << fmt::format("Search: {} on {} x {} ({} per node), global batch {}, sequence {}\n",
                   b.model.name, b.cluster.num_gpus, b.cluster.gpu.name, b.cluster.gpus_per_node,
                   b.training.global_batch_size, b.training.seq_length);
  o << fmt::format("Framework {}: only the layouts it runs are searched\n",
                   framework_title(b.training.framework));
  o << fmt::format(
      "Objective {}; evaluated {} layouts in {:.3f} s ({:.2f} M/s over {:.3f} s of evaluation, {} "
      "threads); "
      "{} fit; {} planned with the schedule walk\n\n",
      to_string(r.objective), r.evaluated, r.seconds,
      r.evaluate_seconds > 0 ? static_cast<double>(r.evaluated) / r.evaluate_seconds / 1e6 : 0.0,
      r.evaluate_seconds, r.threads, r.feasible, r.walked);
  // cp and ep get a labelled column when a listed plan splits them (every axis that is not 1 is
  // shown; a table of dense, short-sequence layouts keeps its width).
  bool show_cp = false;
  bool show_ep = false;
  auto note_axes = [&](const Plan& p) {
    show_cp = show_cp || p.layout.cp > 1;
    show_ep = show_ep || p.layout.ep > 1;
  };
  for (const Plan& p : r.plans) note_axes(p);
  if (r.closest) note_axes(*r.closest);
  auto row = [&](const Plan& p, const std::string& rank) {
    const Layout& l = p.layout;
    const std::string zero =
        l.zero_stage == 0
            ? "0"
            : (l.fsdp_shard_size > 0 ? fmt::format("{}/{}", l.zero_stage, l.fsdp_shard_size)
                                     : std::to_string(l.zero_stage));
    o << fmt::format(
        "{:>4} {:>3}{} {:>3} {:>3} {:>5}{} {:>6} {:>3} {:>9} {:>16} {:>3} {:>9.2f} {:>10.1f} "
        "{:>12.0f} {:>5.1f}{}{}{}\n",
        rank, l.tp, show_cp ? fmt::format(" {:>3}", l.cp) : "", l.pp, l.virtual_stages, l.dp,
        show_ep ? fmt::format(" {:>3}", l.ep) : "", zero, l.sequence_parallel ? "on" : "-",
        to_string(l.recompute), to_string(l.schedule), l.micro_batch_size,
        to_gib(p.figures.peak_bytes), p.figures.step_seconds * 1e3, p.figures.tokens_per_second,
        p.figures.mfu * 100,
        l.cp > 1 ? fmt::format(" cp_comm={}", to_string(b.parallel.cp_comm)) : "",
        l.etp > 1 ? fmt::format(" etp={}", l.etp) : "",
        l.split == SplitChoice::light_ends ? " light ends" : "");
  };
  const std::string header = fmt::format(
      "{:>4} {:>3}{} {:>3} {:>3} {:>5}{} {:>6} {:>3} {:>9} {:>16} {:>3} {:>9} {:>10} {:>12} "
      "{:>5}\n",
      "rank", "tp", show_cp ? fmt::format(" {:>3}", "cp") : "", "pp", "v", "dp",
      show_ep ? fmt::format(" {:>3}", "ep") : "", "zero", "sp", "recompute", "schedule", "mb",
      "peak GiB", "step ms", "tokens/s", "MFU%");
  if (!r.plans.empty()) {
    o << header;
    int rank = 1;
    for (const Plan& p : r.plans) row(p, std::to_string(rank++));
    {
      const Plan& best = r.plans.front();
      const Scenario s = make_scenario(b, best.layout);
      const double gpus = static_cast<double>(best.layout.num_gpus());
      const ThroughputInterval ti = throughput_interval(s, best.figures.tokens_per_second, walk());
      o << fmt::format(
          "\nRank 1: {:.0f} tokens/s per GPU, {:.0f} % interval {:.0f}-{:.0f} ({} runs of the "
          "public corpus{}, docs/fidelity.md).",
          best.figures.tokens_per_second / gpus, 100 * ti.confidence, ti.low / gpus, ti.high / gpus,
          ti.runs, ti.pooled ? ", all kinds" : fmt::format(", {}", to_string(ti.kind)));
    }
    o << fmt::format(
        "\nCapacity {:.2f} GiB per GPU, margin {:.0f}%. 'zero 3/8': ZeRO-3 sharded over "
        "groups of 8; v: virtual stages.{}\n",
        to_gib(r.plans.front().figures.capacity_bytes), req.options.memory_margin * 100,
        show_cp ? fmt::format(" cp: context parallel ({} exchange).", to_string(b.parallel.cp_comm))
                : "");
  } else {
    const bool below = r.rejected[static_cast<int>(Reject::below_target)] > 0;
    o << (r.evaluated == 0 ? "No layout satisfies the constraints and pins.\n"
          : below          ? "Layouts fit, but none reaches the target throughput.\n"
                           : "No layout fits.\n");
    if (r.closest) {
      o << "Closest:\n" << header;
      row(*r.closest, "-");
    }
    for (const Suggestion& s : r.suggestions) o << "  - " << s.detail << '\n';
  }
  o << "\nRejected:\n";
  for (int i = 0; i < kNumRejects; ++i) {
    if (r.rejected[i] > 0) {
      o << fmt::format("  {:<36} {:>12}\n", to_string(static_cast<Reject>(i)), r.rejected[i]);
    }
  }
  return o.str();
}

}  // namespace distplan::search
