#include "distplan/gpu_backend/measurement_json.h"

#include <nlohmann/json.hpp>

namespace distplan::backend {
namespace {

Group group_from(const std::string& s) {
  for (Group g : {Group::dp, Group::dp_replicate, Group::tp, Group::pp, Group::embedding})
    if (to_string(g) == s) return g;
  return Group::dp;
}
CollectiveOp op_from(const std::string& s) {
  for (CollectiveOp o : {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter,
                         CollectiveOp::all_gather, CollectiveOp::send_recv})
    if (to_string(o) == s) return o;
  return CollectiveOp::all_reduce;
}
sim::Op action_op_from(const std::string& s) {
  for (sim::Op o :
       {sim::Op::forward, sim::Op::backward, sim::Op::backward_input, sim::Op::backward_weight})
    if (sim::to_string(o) == s) return o;
  return sim::Op::forward;
}

}  // namespace

nlohmann::json to_json(const RankMeasurement& r) {
  nlohmann::json mem = nlohmann::json::object();
  for (int i = 0; i < kNumMemoryTags; ++i) {
    mem[std::string(to_string(static_cast<MemoryTag>(i))) + "_bytes"] = r.memory.peak[i];
  }
  mem["peak_bytes"] = r.memory.peak_total;  // joint peak of all tagged bytes
  nlohmann::json actions = nlohmann::json::array();
  for (const ExecutedAction& a : r.actions) {
    actions.push_back({{"op", sim::to_string(a.action.op)},
                       {"microbatch", a.action.microbatch},
                       {"chunk", a.action.chunk},
                       {"seconds", a.seconds}});
  }
  nlohmann::json comm = nlohmann::json::array();
  for (const auto& [k, v] : r.communication) {
    comm.push_back({{"group", to_string(std::get<0>(k))},
                    {"op", to_string(std::get<1>(k))},
                    {"what", std::get<2>(k)},
                    {"bytes", v.bytes},
                    {"calls", v.calls}});
  }
  return {{"rank", r.rank},
          {"tp", r.coords.tp},
          {"dp", r.coords.dp},
          {"stage", r.coords.pp},
          {"memory", mem},
          {"actions", actions},
          {"communication", comm},
          {"step_seconds", r.step_seconds},
          {"optimizer_seconds", r.optimizer_seconds}};
}

RankMeasurement rank_measurement_from_json(const nlohmann::json& j) {
  RankMeasurement r;
  r.rank = j.at("rank").get<int>();
  r.coords.tp = j.at("tp").get<int>();
  r.coords.dp = j.at("dp").get<int>();
  r.coords.pp = j.at("stage").get<int>();
  const auto& mem = j.at("memory");
  for (int i = 0; i < kNumMemoryTags; ++i) {
    r.memory.peak[i] =
        mem.at(std::string(to_string(static_cast<MemoryTag>(i))) + "_bytes").get<Bytes>();
  }
  r.memory.peak_total = mem.at("peak_bytes").get<Bytes>();
  for (const auto& a : j.at("actions")) {
    ExecutedAction e;
    e.action.op = action_op_from(a.at("op").get<std::string>());
    e.action.microbatch = a.at("microbatch").get<std::int32_t>();
    e.action.chunk = a.at("chunk").get<std::int32_t>();
    e.seconds = a.at("seconds").get<double>();
    r.actions.push_back(e);
  }
  for (const auto& c : j.at("communication")) {
    CommLog::Key k{group_from(c.at("group").get<std::string>()),
                   op_from(c.at("op").get<std::string>()), c.at("what").get<std::string>()};
    r.communication[k] = CommTotals{c.at("bytes").get<Bytes>(), c.at("calls").get<Count>()};
  }
  r.step_seconds = j.at("step_seconds").get<double>();
  r.optimizer_seconds = j.at("optimizer_seconds").get<double>();
  return r;
}

nlohmann::json to_json(const Measurement& m) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : m.ranks) ranks.push_back(to_json(r));
  return {{"schema", "distplan.measurement/v1"},
          {"losses", m.losses},
          {"skipped", m.skipped},
          {"ranks", ranks}};
}

Measurement measurement_from_json(const nlohmann::json& j) {
  Measurement m;
  m.losses = j.at("losses").get<std::vector<double>>();
  m.skipped = j.at("skipped").get<std::vector<bool>>();
  for (const auto& r : j.at("ranks")) m.ranks.push_back(rank_measurement_from_json(r));
  return m;
}

}  // namespace distplan::backend
