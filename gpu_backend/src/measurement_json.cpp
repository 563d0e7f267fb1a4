#include "distplan/gpu_backend/measurement_json.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "distplan/simulator/simulate_json.h"

namespace distplan::backend {
namespace {

Group group_from(const std::string& s) {
  for (Group g : {Group::dp, Group::dp_replicate, Group::tp, Group::pp, Group::embedding, Group::cp,
                  Group::ep, Group::edp, Group::etp})
    if (to_string(g) == s) return g;
  throw std::runtime_error("measurement: unknown group '" + s + "'");
}
Traffic traffic_from(const std::string& s) {
  if (const auto t = traffic_from_string(s)) return *t;
  throw std::runtime_error("measurement: unknown traffic '" + s + "'");
}
CollectiveOp op_from(const std::string& s) {
  for (CollectiveOp o :
       {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter, CollectiveOp::all_gather,
        CollectiveOp::send_recv, CollectiveOp::all_to_all})
    if (to_string(o) == s) return o;
  throw std::runtime_error("measurement: unknown collective '" + s + "'");
}
sim::Op action_op_from(const std::string& s) {
  for (sim::Op o :
       {sim::Op::forward, sim::Op::backward, sim::Op::backward_input, sim::Op::backward_weight})
    if (sim::to_string(o) == s) return o;
  return sim::Op::forward;
}

sim::Track track_from(const std::string& s) {
  for (sim::Track t : {sim::Track::compute, sim::Track::send_next, sim::Track::send_prev,
                       sim::Track::dp, sim::Track::zero3})
    if (sim::to_string(t) == s) return t;
  return sim::Track::compute;
}
sim::SliceKind kind_from(const std::string& s) {
  for (int k = 0; k <= static_cast<int>(sim::SliceKind::zero3_gather); ++k)
    if (sim::to_string(static_cast<sim::SliceKind>(k)) == s) return static_cast<sim::SliceKind>(k);
  return sim::SliceKind::forward;
}

}  // namespace

nlohmann::json to_json(const RankMeasurement& r) {
  nlohmann::json mem = nlohmann::json::object();
  for (int i = 0; i < kNumMemoryTags; ++i) {
    mem[std::string(to_string(static_cast<MemoryTag>(i))) + "_bytes"] = r.memory.peak[i];
  }
  mem["peak_bytes"] = r.memory.peak_total;         // joint peak of all tagged bytes
  mem["reserved_bytes"] = r.memory.peak_reserved;  // the caching allocator's segments at peak
  nlohmann::json actions = nlohmann::json::array();
  for (const ExecutedAction& a : r.actions) {
    actions.push_back({{"op", sim::to_string(a.action.op)},
                       {"microbatch", a.action.microbatch},
                       {"chunk", a.action.chunk},
                       {"seconds", a.seconds}});
    // DualPipe's F&B pairs: the forward that runs with the next action.
    if (a.action.overlap_next) actions.back()["overlap_next"] = true;
  }
  nlohmann::json comm = nlohmann::json::array();
  for (const auto& [k, v] : r.communication) {
    comm.push_back({{"group", to_string(std::get<0>(k))},
                    {"op", to_string(std::get<1>(k))},
                    {"what", to_string(std::get<2>(k))},
                    {"bytes", v.bytes},
                    {"calls", v.calls}});
  }
  nlohmann::json timeline = nlohmann::json::array();
  for (const sim::TraceEvent& e : r.timeline) {
    timeline.push_back({{"track", sim::to_string(e.track)},
                        {"kind", sim::to_string(e.kind)},
                        {"microbatch", e.microbatch},
                        {"chunk", e.chunk},
                        {"start_seconds", e.start},
                        {"seconds", e.duration}});
  }
  nlohmann::json out = {{"rank", r.rank},
                        {"tp", r.coords.tp},
                        {"cp", r.coords.cp},
                        {"dp", r.coords.dp},
                        {"stage", r.coords.pp},
                        {"memory", mem},
                        {"actions", actions},
                        {"communication", comm},
                        {"timeline", timeline},
                        {"step_seconds", r.step_seconds},
                        {"optimizer_seconds", r.optimizer_seconds}};
  // MoE models: the token copies the routing dispatched (run.h, MoeRouting).
  if (r.moe.copies > 0) {
    out["moe_routing"] = {{"copies", r.moe.copies},
                          {"to_other_ranks", r.moe.to_other_ranks},
                          {"received", r.moe.received}};
  }
  return out;
}

RankMeasurement rank_measurement_from_json(const nlohmann::json& j) {
  RankMeasurement r;
  r.rank = j.at("rank").get<int>();
  r.coords.tp = j.at("tp").get<int>();
  r.coords.cp = j.value("cp", 0);  // absent before context parallelism
  r.coords.dp = j.at("dp").get<int>();
  r.coords.pp = j.at("stage").get<int>();
  const auto& mem = j.at("memory");
  for (int i = 0; i < kNumMemoryTags; ++i) {
    r.memory.peak[i] =
        mem.at(std::string(to_string(static_cast<MemoryTag>(i))) + "_bytes").get<Bytes>();
  }
  r.memory.peak_total = mem.at("peak_bytes").get<Bytes>();
  r.memory.peak_reserved = mem.value("reserved_bytes", Bytes{0});
  for (const auto& a : j.at("actions")) {
    ExecutedAction e;
    e.action.op = action_op_from(a.at("op").get<std::string>());
    e.action.microbatch = a.at("microbatch").get<std::int32_t>();
    e.action.chunk = a.at("chunk").get<std::int32_t>();
    e.action.overlap_next = a.value("overlap_next", false);
    e.seconds = a.at("seconds").get<double>();
    r.actions.push_back(e);
  }
  for (const auto& c : j.at("communication")) {
    CommLog::Key k{group_from(c.at("group").get<std::string>()),
                   op_from(c.at("op").get<std::string>()),
                   traffic_from(c.at("what").get<std::string>())};
    r.communication[k] = CommTotals{c.at("bytes").get<Bytes>(), c.at("calls").get<Count>()};
  }
  if (j.contains("moe_routing")) {
    const auto& m = j.at("moe_routing");
    r.moe.copies = m.at("copies").get<Count>();
    r.moe.to_other_ranks = m.at("to_other_ranks").get<Count>();
    r.moe.received = m.at("received").get<Count>();
  }
  if (j.contains("timeline")) {
    for (const auto& t : j.at("timeline")) {
      sim::TraceEvent e;
      e.stage = static_cast<std::int32_t>(r.coords.pp);
      e.track = track_from(t.at("track").get<std::string>());
      e.kind = kind_from(t.at("kind").get<std::string>());
      e.microbatch = t.at("microbatch").get<std::int32_t>();
      e.chunk = t.at("chunk").get<std::int32_t>();
      e.start = t.at("start_seconds").get<double>();
      e.duration = t.at("seconds").get<double>();
      r.timeline.push_back(e);
    }
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

std::string timeline_trace_json(const Measurement& m) {
  std::vector<const RankMeasurement*> ranks;
  for (const RankMeasurement& r : m.ranks) ranks.push_back(&r);
  std::sort(ranks.begin(), ranks.end(),
            [](const RankMeasurement* a, const RankMeasurement* b) { return a->rank < b->rank; });
  sim::SimResult r;
  std::set<int> seen;
  for (const RankMeasurement* x : ranks) {
    if (!seen.insert(x->coords.pp).second) continue;
    sim::StageResult st;
    st.stage = x->coords.pp;
    st.optimizer_seconds = x->optimizer_seconds;
    r.stages.push_back(st);
    r.step_seconds = std::max(r.step_seconds, x->step_seconds);
    for (sim::TraceEvent e : x->timeline) {
      e.stage = static_cast<std::int32_t>(x->coords.pp);
      r.trace.push_back(e);
    }
  }
  std::sort(r.stages.begin(), r.stages.end(),
            [](const sim::StageResult& a, const sim::StageResult& b) { return a.stage < b.stage; });
  nlohmann::json doc = nlohmann::json::parse(sim::trace_to_json(r));
  doc["otherData"] = {{"generator", "distplan validate (executed timeline)"},
                      {"step_seconds", r.step_seconds}};
  return doc.dump(1) + "\n";
}

}  // namespace distplan::backend
