// The human table of a plan, and "what would make it fit".
#include "distplan/planner/report.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/interval.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/op_costs.h"
#include "distplan/planner/peft.h"
#include "distplan/planner/validate.h"

namespace distplan {
namespace {

std::string gib(Bytes b) {
  return fmt::format("{:.2f}", to_gib(b));
}

std::string human_bytes(Bytes b) {
  const double d = static_cast<double>(b);
  if (d >= kGiB) return fmt::format("{:.2f} GiB", d / kGiB);
  if (d >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", d / (1024.0 * 1024.0));
  if (d >= 1024.0) return fmt::format("{:.1f} KiB", d / 1024.0);
  return fmt::format("{} B", b);
}

std::string human_count(double n) {
  if (n >= 1e12) return fmt::format("{:.2f} T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f} M", n / 1e6);
  return fmt::format("{:.0f}", n);
}

}  // namespace

// Every axis that is not 1 is named: tp, pp and dp always, cp (with its exchange), v, ep and etp
// when they split something, then ZeRO (with a hybrid shard group) and the schedule.
std::string layout_line(const ParallelSpec& p) {
  std::string out = fmt::format("tp={}", p.tp);
  if (p.cp > 1) out += fmt::format(" cp={} ({})", p.cp, to_string(p.cp_comm));
  out += fmt::format(" pp={}", p.pp);
  if (p.virtual_stages > 1) out += fmt::format(" v={}", p.virtual_stages);
  out += fmt::format(" dp={}", p.dp);
  if (p.ep > 1) out += fmt::format(" ep={}", p.ep);
  if (p.etp > 1) out += fmt::format(" etp={}", p.etp);
  out += fmt::format(", ZeRO-{}", p.zero_stage);
  if (p.zero_stage > 0 && p.fsdp_shard_size != p.dp)
    out += fmt::format(" (shard {})", p.fsdp_shard_size);
  if (p.sequence_parallel) out += ", sequence parallel";
  out += fmt::format(", recompute {}, {}", to_string(p.recompute), to_string(p.schedule));
  if (p.offload_optimizer != Offload::none)
    out += fmt::format(", optimizer offloaded to {}", to_string(p.offload_optimizer));
  if (p.offload_params != Offload::none)
    out += fmt::format(", parameters offloaded to {}", to_string(p.offload_params));
  return out;
}

namespace {

// Tries `s` and appends it when it is valid and lowers the peak.
void try_change(std::vector<FitSuggestion>& out, const PlanFunction& plan, const Estimate& base,
                Count base_gpus, std::string change, Scenario s) {
  try {
    validate_scenario(s);
  } catch (const InputError&) {
    return;
  }
  const Estimate e = plan(s);
  // In reserved bytes: what fits compares (= total under the generic profile).
  if (e.memory.peak_reserved_bytes >= base.memory.peak_reserved_bytes) return;
  if (!e.memory.host_fits) return;
  FitSuggestion f;
  f.change = std::move(change);
  f.peak_bytes = e.memory.peak_reserved_bytes;
  f.saving_bytes = base.memory.peak_reserved_bytes - e.memory.peak_reserved_bytes;
  f.fits = e.memory.fits;
  f.more_gpus = s.cluster.num_gpus > base_gpus;
  f.step_seconds = e.time.step_seconds;
  f.time_cost_seconds = e.time.step_seconds - base.time.step_seconds;
  f.scenario = std::move(s);
  out.push_back(std::move(f));
}

// What the user can act on first: fitting on their GPUs (cheapest in time), then lower peaks on
// their GPUs, then more GPUs.
bool suggestion_before(const FitSuggestion& a, const FitSuggestion& b) {
  if (a.more_gpus != b.more_gpus) return !a.more_gpus;
  if (!a.more_gpus && a.fits != b.fits) return a.fits;
  if (!a.more_gpus && a.fits) {
    if (a.step_seconds != b.step_seconds) return a.step_seconds < b.step_seconds;
  }
  return a.peak_bytes < b.peak_bytes;
}

}  // namespace

namespace {

std::vector<FitSuggestion> single_changes(const Scenario& s, const Estimate& e,
                                          const PlanFunction& plan, bool more_gpus = true) {
  std::vector<FitSuggestion> out;
  const ParallelSpec& p = s.parallel;
  for (int z = p.zero_stage + 1; z <= 3; ++z) {
    if (p.dp * p.cp == 1) break;  // ZeRO shards over dp·cp
    Scenario x = s;
    x.parallel.zero_stage = z;
    try_change(out, plan, e, s.cluster.num_gpus, fmt::format("ZeRO-{}", z), x);
  }
  if (p.recompute != Recompute::full) {
    if (p.recompute == Recompute::none) {
      Scenario x = s;
      x.parallel.recompute = Recompute::selective;
      try_change(out, plan, e, s.cluster.num_gpus, "selective recompute", x);
      if (s.training.framework == Framework::torchtitan) {  // torchtitan's per-op policy
        x.parallel.recompute = Recompute::selective_op;
        try_change(out, plan, e, s.cluster.num_gpus, "per-op selective checkpointing", x);
      }
    }
    Scenario x = s;
    x.parallel.recompute = Recompute::full;
    try_change(out, plan, e, s.cluster.num_gpus, "full recompute", x);
  }
  if (!p.sequence_parallel && p.tp > 1) {
    Scenario x = s;
    x.parallel.sequence_parallel = true;
    try_change(out, plan, e, s.cluster.num_gpus, "sequence parallel", x);
  }
  if (p.dp % 2 == 0) {
    Scenario x = s;
    x.parallel.tp *= 2;
    x.parallel.dp /= 2;
    x.parallel.fsdp_shard_size = std::max<Count>(1, x.parallel.fsdp_shard_size / 2);
    if (x.parallel.dp % x.parallel.fsdp_shard_size != 0) x.parallel.fsdp_shard_size = x.parallel.dp;
    try_change(out, plan, e, s.cluster.num_gpus,
               fmt::format("tp={} (dp={})", x.parallel.tp, x.parallel.dp), x);
    Scenario y = s;
    y.parallel.pp *= 2;
    y.parallel.dp /= 2;
    y.parallel.fsdp_shard_size = x.parallel.fsdp_shard_size;
    y.parallel.layers_per_stage.clear();
    try_change(out, plan, e, s.cluster.num_gpus,
               fmt::format("pp={} (dp={})", y.parallel.pp, y.parallel.dp), y);
  }
  // Context parallelism: half the data-parallel ranks split each sequence instead (ring
  // attention, the default exchange); its step time says what the ring costs.
  if (p.dp % 2 == 0) {
    Scenario x = s;
    x.parallel.cp *= 2;
    x.parallel.dp /= 2;
    x.parallel.fsdp_shard_size = std::max<Count>(1, x.parallel.fsdp_shard_size / 2);
    if (x.parallel.dp % x.parallel.fsdp_shard_size != 0) x.parallel.fsdp_shard_size = x.parallel.dp;
    try_change(out, plan, e, s.cluster.num_gpus,
               fmt::format("cp={} (dp={})", x.parallel.cp, x.parallel.dp), x);
  }
  if (s.training.micro_batch_size > 1) {
    Scenario x = s;
    x.training.micro_batch_size /= 2;
    try_change(out, plan, e, s.cluster.num_gpus,
               fmt::format("micro_batch_size={}", x.training.micro_batch_size), x);
  }
  if (p.schedule == Schedule::gpipe) {
    Scenario x = s;
    x.parallel.schedule = Schedule::one_f_one_b;
    try_change(out, plan, e, s.cluster.num_gpus, "1F1B schedule", x);
  }
  // ZeRO-Offload: the optimizer partition (and at ZeRO-3 the parameters) to host memory; a
  // change that overflows the host memory given for the node is not offered.
  if (p.zero_stage >= 1 && p.offload_optimizer == Offload::none) {
    Scenario x = s;
    x.parallel.offload_optimizer = Offload::cpu;
    try_change(out, plan, e, s.cluster.num_gpus, "offload optimizer to CPU", x);
  }
  if (p.zero_stage == 3 && p.offload_params == Offload::none) {
    Scenario x = s;
    x.parallel.offload_params = Offload::cpu;
    if (x.parallel.offload_optimizer == Offload::none) x.parallel.offload_optimizer = Offload::cpu;
    try_change(out, plan, e, s.cluster.num_gpus,
               p.offload_optimizer == Offload::none ? "offload optimizer and parameters to CPU"
                                                    : "offload parameters to CPU",
               x);
  }
  if (more_gpus) {
    // More GPUs: twice the data-parallel ranks with ZeRO-3 sharding everything, or a pipeline
    // twice as deep.
    Scenario x = s;
    x.cluster.num_gpus *= 2;
    x.parallel.dp *= 2;
    x.parallel.fsdp_shard_size = x.parallel.dp;
    x.parallel.zero_stage = 3;
    try_change(out, plan, e, s.cluster.num_gpus,
               fmt::format("{} GPUs, dp={} with ZeRO-3", x.cluster.num_gpus, x.parallel.dp), x);
    Scenario y = s;
    y.cluster.num_gpus *= 2;
    y.parallel.pp *= 2;
    y.parallel.layers_per_stage.clear();
    try_change(out, plan, e, s.cluster.num_gpus,
               fmt::format("{} GPUs, pp={}", y.cluster.num_gpus, y.parallel.pp), y);
  }
  std::stable_sort(out.begin(), out.end(), suggestion_before);
  return out;
}

}  // namespace

std::vector<FitSuggestion> fit_suggestions(const Scenario& s, const Estimate& e,
                                           const PlanFunction& plan) {
  // More GPUs are suggested only for a layout that does not fit.
  std::vector<FitSuggestion> out = single_changes(s, e, plan, /*more_gpus=*/!e.memory.fits);
  const auto fits_here = [](const FitSuggestion& f) { return f.fits && !f.more_gpus; };
  if (out.empty() || std::any_of(out.begin(), out.end(), fits_here)) return out;
  // No single change fits: combine the best change of each round, greedily, first on the same
  // GPUs and only then with more.
  FitSuggestion combined;
  for (bool more_gpus : {false, true}) {
    auto first = single_changes(s, e, plan, more_gpus);
    if (first.empty()) continue;
    combined = first.front();
    for (int round = 0; round < 4 && !combined.fits; ++round) {
      const auto next = single_changes(combined.scenario, plan(combined.scenario), plan, more_gpus);
      if (next.empty()) break;
      combined.change += " + " + next.front().change;
      combined.scenario = next.front().scenario;
      combined.peak_bytes = next.front().peak_bytes;
      combined.fits = next.front().fits;
    }
    if (combined.fits) break;
  }
  combined.more_gpus = combined.scenario.cluster.num_gpus > s.cluster.num_gpus;
  const bool any_fit =
      std::any_of(out.begin(), out.end(), [](const FitSuggestion& f) { return f.fits; });
  if (combined.fits && (!combined.more_gpus || !any_fit)) {
    combined.saving_bytes = e.memory.peak_reserved_bytes - combined.peak_bytes;
    combined.step_seconds = plan(combined.scenario).time.step_seconds;
    combined.time_cost_seconds = combined.step_seconds - e.time.step_seconds;
    out.push_back(std::move(combined));
    std::stable_sort(out.begin(), out.end(), suggestion_before);
  }
  return out;
}

std::string format_plan_table(const Scenario& s, const Estimate& e, const PlanFunction& plan) {
  std::string out;
  auto line = [&out](const std::string& l) { out += l + '\n'; };
  const auto& m = s.model;
  const auto& t = s.training;
  line(fmt::format("distplan plan: {} on {} x {} ({} per node)", m.name, s.cluster.num_gpus,
                   s.cluster.gpu.name, s.cluster.gpus_per_node));
  line(fmt::format("  framework: {}", framework_title(t.framework)));
  line(fmt::format("  layout: {}", layout_line(s.parallel)));
  line(fmt::format("  model: {} parameters, {} layers, hidden {}, {} heads ({} kv), vocab {}",
                   human_count(static_cast<double>(e.parameters)), m.num_layers, m.hidden_size,
                   m.num_attention_heads, m.num_kv_heads, m.vocab_size));
  line(
      fmt::format("  training: {} {}, seq {}, global batch {}, micro-batch {} -> {} micro-batches "
                  "per pipeline per step",
                  t.fp8 != Fp8Recipe::none ? fmt::format("fp8 ({} scaling)", to_string(t.fp8))
                                           : std::string(to_string(t.precision)),
                  to_string(t.optimizer), t.seq_length, t.global_batch_size, t.micro_batch_size,
                  e.num_microbatches));
  if (t.peft.enabled()) {
    // Fine-tuning (docs/peft.md): what trains, as PEFT counts it, and how the base is stored.
    const PeftSpec& p = t.peft;
    const PeftParameterCount c =
        peft_parameter_count(m, planner_layer_table(m, t), p, e.parameters);
    std::string what = std::string(to_string(p.method));
    if (p.adapters()) {
      std::string targets;
      for (std::string_view n : peft_target_names(p.naming, p.targets)) {
        if (!targets.empty()) targets += ',';
        targets += n;
      }
      what += fmt::format(" r={} on {}", p.rank, p.all_linear ? "all-linear" : targets);
    }
    if (p.frozen_layers > 0) what += fmt::format(", layers 0-{} frozen", p.frozen_layers - 1);
    line(fmt::format("  fine-tuning: {}, base {}{}; {} of {} parameters train ({:.2f}%)", what,
                     to_string(p.base_storage), p.double_quant ? " + double quantization" : "",
                     human_count(static_cast<double>(c.trainable)),
                     human_count(static_cast<double>(c.all)),
                     100.0 * static_cast<double>(c.trainable) / static_cast<double>(c.all)));
  }
  line("");
  line(fmt::format("Memory per GPU (GiB = 2^30 bytes), capacity {} GiB",
                   gib(e.memory.capacity_bytes)));
  if (v_shape(s.parallel.schedule)) {
    line(
        "  (layers: chunk 0 of each stage; in the V its chunk 1 is virtual stage 2pp-1-stage, "
        "so stage 0 also holds the last layers and the LM head)");
  } else if (bidirectional(s.parallel.schedule)) {
    line(
        "  (layers: chunk 0 of each stage, model stage s of the forward direction; its chunk 1 is "
        "model stage pp-1-stage of the reverse one, a second copy; both ends hold the embedding "
        "and the LM head)");
  } else if (s.parallel.virtual_stages > 1) {
    line(
        fmt::format("  (layers: the first chunk of each stage, +{} more chunks further on; the "
                    "JSON's chunk_layers gives every chunk's layers)",
                    s.parallel.virtual_stages - 1));
  }
  // A framework profile adds its transient, and allocated and reserved bytes (docs/memory.md).
  const bool fw = s.assumptions.framework_profile.models_allocator;
  line(fmt::format("  {:>5} {:>9} {:>8} {:>9} {:>9} {:>9} {:>11} {:>9} {:>9} {:>9}{}", "stage",
                   "layers", "in-fl.", "weights", "grads", "optim", "activations", "buffers",
                   "runtime", "total",
                   fw ? fmt::format(" {:>9} {:>9} {:>9}", "transient", "allocated", "reserved")
                      : std::string()));
  for (const StageMemory& st : e.memory.stages) {
    line(fmt::format(
        "  {:>5} {:>9} {:>8.2f} {:>9} {:>9} {:>9} {:>11} {:>9} {:>9} {:>9}{}{}", st.stage,
        // A chunk may hold no layer (the embedding or the LM head alone, pipeline_split.h).
        (st.end_layer > st.first_layer ? fmt::format("{}-{}", st.first_layer, st.end_layer - 1)
                                       : std::string("none")) +
            (s.parallel.virtual_stages > 1 ? fmt::format(" +{}", s.parallel.virtual_stages - 1)
                                           : std::string()),
        st.inflight_microbatches, gib(st.weights_bytes), gib(st.gradients_bytes),
        gib(st.optimizer_bytes), gib(st.activations_bytes), gib(st.buffers_bytes),
        gib(st.runtime_bytes), gib(st.total_bytes),
        fw ? fmt::format(" {:>9} {:>9} {:>9}", gib(st.transient_bytes), gib(st.allocated_bytes),
                         gib(st.reserved_bytes))
           : std::string(),
        st.stage == e.memory.peak_stage ? "  <- peak" : ""));
  }
  const StageMemory& peak = e.memory.stages[static_cast<std::size_t>(e.memory.peak_stage)];
  const std::array<std::pair<const char*, Bytes>, 5> cats = {
      {{"weights", peak.weights_bytes},
       {"gradients", peak.gradients_bytes},
       {"optimizer", peak.optimizer_bytes},
       {"activations", peak.activations_bytes},
       {"buffers", peak.buffers_bytes}}};
  const auto dom = *std::max_element(
      cats.begin(), cats.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const double share = static_cast<double>(dom.second) / static_cast<double>(peak.total_bytes);
  if (fw) {
    line(fmt::format(
        "  {}: peak allocated {} GiB (max_memory_allocated), reserved {} GiB with the runtime "
        "outside the allocator (what fits compares).",
        to_string(s.training.framework), gib(e.memory.peak_allocated_bytes),
        gib(e.memory.peak_reserved_bytes)));
  }
  if (e.memory.fits) {
    line(fmt::format(
        "  Peak {} GiB on stage {}: fits, {} GiB to spare. Largest: {} ({:.0f}% of the peak).",
        gib(e.memory.peak_reserved_bytes), e.memory.peak_stage,
        gib(e.memory.capacity_bytes - e.memory.peak_reserved_bytes), dom.first, 100 * share));
  } else {
    line(fmt::format(
        "  DOES NOT FIT: peak {} GiB on stage {} exceeds {} GiB by {} GiB. Largest: {} ({:.0f}%).",
        gib(e.memory.peak_reserved_bytes), e.memory.peak_stage, gib(e.memory.capacity_bytes),
        gib(e.memory.peak_reserved_bytes - e.memory.capacity_bytes), dom.first, 100 * share));
    const auto fixes = fit_suggestions(s, e, plan);
    if (fixes.empty()) {
      line(
          "  No single change of the layout lowers the peak; more GPUs per layout or a shorter "
          "sequence would.");
    } else {
      line("  What would help, on these GPUs first (peak after each change; step time it costs):");
      for (const auto& f : fixes) {
        line(fmt::format("    {:<40} -{:>8} GiB -> {:>8} GiB  {:>+9.1f} ms/step {}", f.change,
                         gib(f.saving_bytes), gib(f.peak_bytes), f.time_cost_seconds * 1e3,
                         f.fits ? "(fits)" : ""));
      }
    }
  }
  if (s.parallel.offload_optimizer != Offload::none) {
    // Offload (docs/memory.md and docs/time.md, "Offload").
    std::string host =
        fmt::format("  Host memory per node: {} GiB", gib(e.memory.host_bytes_per_node));
    if (e.memory.host_capacity_bytes > 0) {
      host += fmt::format(" of {} GiB{}", gib(e.memory.host_capacity_bytes),
                          e.memory.host_fits ? "" : ": DOES NOT FIT");
    }
    if (e.memory.nvme_bytes_per_node > 0)
      host += fmt::format("; NVMe per node: {} GiB", gib(e.memory.nvme_bytes_per_node));
    line(host + ".");
    std::string traffic = fmt::format(
        "  Offload per step: PCIe {} per GPU ({:.1f} ms before overlap), CPU optimizer {:.1f} ms",
        human_bytes(e.offload.pcie_bytes_per_gpu_per_step), e.offload.pcie_seconds * 1e3,
        e.offload.cpu_optimizer_seconds * 1e3);
    if (e.offload.nvme_bytes_per_node_per_step > 0) {
      traffic += fmt::format(", NVMe {} per node ({:.1f} ms)",
                             human_bytes(e.offload.nvme_bytes_per_node_per_step),
                             e.offload.nvme_seconds * 1e3);
    }
    line(traffic);
  }
  line("");
  line(fmt::format("Communication per GPU per step (busiest stage): {} on the wire",
                   human_bytes(e.communication.wire_bytes_per_gpu_per_step)));
  line(fmt::format("  {:<13} {:<15} {:<11} {:>4} {:>12} {:>8} {:>12} {:>10}  {}", "group", "op",
                   "link", "n", "bytes/call", "calls", "wire", "time ms", "what"));
  for (const Collective& c : e.communication.collectives) {
    line(fmt::format("  {:<13} {:<15} {:<11} {:>4} {:>12} {:>8} {:>12} {:>10.2f}  {}",
                     to_string(c.group), to_string(c.op), to_string(c.link), c.group_size,
                     human_bytes(c.bytes_per_call), c.calls_per_step,
                     human_bytes(c.wire_bytes_per_gpu_per_step), c.seconds_per_step * 1e3,
                     c.what()));
  }
  line("");
  line(
      fmt::format("Compute per step: {:.3g} model FLOPs (causal attention, Megatron-LM's count), "
                  "{:.3g} hardware FLOPs (with recompute)",
                  e.compute.model_flops_per_step, e.compute.hardware_flops_per_step));
  // The engine that timed the step: the schedule's walk (the plan), or estimate()'s closed-form
  // lower bound when a caller formats an estimate alone.
  const bool walked = e.time.engine == TimeEngine::schedule_walk;
  line(fmt::format(
      "Time ({}, op roofline, GEMM ceiling {:.0f}% of peak): step {:.1f} ms, "
      "{:.0f} tokens/s, MFU {:.1f}%",
      walked ? "schedule walk" : "closed-form lower bound", 100 * device_rates(s).gemm_efficiency,
      e.time.step_seconds * 1e3, e.time.tokens_per_second, 100 * e.time.mfu));
  if (walked) {
    // docs/fidelity.md, "Prediction intervals": the corpus residuals of the same engine.
    const double gpus = static_cast<double>(s.cluster.num_gpus);
    const ThroughputInterval ti = throughput_interval(s, e.time.tokens_per_second, plan);
    line(fmt::format(
        "  {:.0f} tokens/s per GPU, {:.0f} % interval {:.0f}-{:.0f} ({} runs of the public "
        "corpus{}, docs/fidelity.md)",
        e.time.tokens_per_second / gpus, 100 * ti.confidence, ti.low / gpus, ti.high / gpus,
        ti.runs, ti.pooled ? ", all kinds" : fmt::format(", {}", to_string(ti.kind))));
  }
  const double step = e.time.step_seconds > 0 ? e.time.step_seconds : 1.0;
  line(fmt::format(
      "  busiest stage's passes {:.1f} ms, pipeline bubble {:.1f} ms ({:.1f}% of the step), "
      "exposed communication {:.1f} ms, optimizer {:.1f} ms",
      e.time.compute_seconds * 1e3, e.time.bubble_seconds * 1e3, 100 * e.time.bubble_seconds / step,
      e.time.exposed_communication_seconds * 1e3, e.time.optimizer_seconds * 1e3));
  return out;
}

}  // namespace distplan
