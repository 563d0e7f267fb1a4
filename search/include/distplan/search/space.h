// The layout search space: every combination of tp, pp, dp, virtual stages, ZeRO stage (and hybrid
// shard size), micro-batch size, recompute, sequence parallelism and schedule for one model,
// cluster and global batch. The enumerator generates valid layouts directly (no generate-and-test);
// each rule that cuts the space is a named, liftable constraint (docs/search.md, "The space").
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string_view>
#include <vector>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan::search {

/// How a layout splits its layers over the pipeline's virtual stages (pipeline_split.h;
/// docs/search.md, "Pipeline splits"): `even`, the planner's even rule; `light_ends`, the
/// embedding and the LM head with the loss counted as one layer each, the first and the last
/// virtual stage one layer lighter: Megatron-LM's --account-for-embedding-in-pipeline-split and
/// --account-for-loss-in-pipeline-split, torchtitan's default first/last_stage_less_layers = 1.
enum class SplitChoice : std::uint8_t { even, light_ends };
[[nodiscard]] std::string_view to_string(SplitChoice c) noexcept;

/// One point of the space: a parallel layout plus the micro-batch size, ordered by its fields in
/// declaration order (the total key that makes results independent of thread count).
struct Layout {
  Count tp = 1;
  Count pp = 1;
  Count dp = 1;
  Count micro_batch_size = 1;
  Schedule schedule = Schedule::one_f_one_b;
  Count virtual_stages = 1;
  int zero_stage = 0;
  Count fsdp_shard_size = 0;  // 0: the whole dp group (not hybrid); else a proper divisor of dp
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  Count cp = 1;   // context parallel (the exchange, cp_comm, is the base scenario's)
  Count ep = 1;   // expert parallel (MoE models)
  Count etp = 1;  // expert tensor parallel (MoE models; 1 unless the search pins others)
  SplitChoice split = SplitChoice::even;

  [[nodiscard]] Count num_gpus() const noexcept { return tp * cp * pp * dp; }
  bool operator==(const Layout&) const = default;
  auto operator<=>(const Layout&) const = default;
};

/// Choices that cut the space beyond the planner's validity rules. Each can be changed
/// ("search": {"constraints": {"tp_within_node": false}}). The planner's rules (tp*pp*dp = GPUs,
/// tp divides heads, kv heads and ffn, pp <= layers, micro-batches divide the global batch,
/// interleaving needs pp*v | layers and m % pp == 0, sp needs tp | seq) always hold: the
/// enumerator never generates what validate_scenario() would refuse.
struct Constraints {
  bool tp_within_node = true;      // tp <= gpus_per_node and divides it (TP traffic on NVLink)
  bool pp_divides_layers = false;  // equal stages only (the planner splits unevenly otherwise)
  bool sequence_parallel_needs_tp = true;  // sp only with tp > 1 (a no-op at tp = 1)
  bool zero_needs_dp = true;               // ZeRO 1-3 only with dp > 1 (no-ops at dp = 1)
  bool single_schedule_without_pp = true;  // at pp = 1 every schedule is the same: keep one
  bool interleaved_needs_pp = true;        // interleaving only with pp > 1 (a no-op at pp = 1)
  bool hybrid_shard = true;                // also try ZeRO shard groups smaller than dp
  bool whole_nodes = true;         // objective "gpus": GPU counts within one node or in whole nodes
  Count max_micro_batch_size = 0;  // 0: every divisor of the per-replica batch
  // Context parallel only where each rank keeps at least this many tokens of a sequence: the
  // ring's exchange hides behind attention only for long chunks, and Megatron-Core recommends CP
  // for long sequences (docs/search.md). 0 lifts it.
  Count min_tokens_per_cp_rank = 4096;
  bool operator==(const Constraints&) const = default;
};

/// Why part of the space was cut. Counts are of the partial combinations cut at the level where
/// the rule applies (docs/search.md, "Rejection counts").
enum class Reject : int {
  // Planner validity rules.
  gpus_not_divisible,  // tp*pp*dp differs from the GPU count (or a pinned value exceeds it)
  tp_divides_heads,    // tp divides num_attention_heads and num_kv_heads
  tp_divides_ffn,      // tp divides ffn_hidden_size
  pp_exceeds_layers,
  batch_not_divisible,       // dp*micro_batch_size does not divide the global batch
  too_few_layers,            // more virtual stages than a split can fill with layers
  virtual_stages_uneven,     // unpinned interleaved v whose virtual stages no split fills evenly
  interleaved_microbatches,  // interleaved: micro-batches per step a multiple of pp
  sequence_parallel_divides_seq,  // sp: tp divides seq_length
  shard_not_divisor,              // a pinned fsdp_shard_size that does not divide dp
  v_shape_microbatches,           // V schedules: at least 2 pp micro-batches per step
  cp_divides_seq,                 // cp: 2·cp (cp under a2a) chunks divide seq_length
  cp_divides_heads,               // cp a2a: cp divides the heads and KV heads per TP rank
  cp_needs_flash,                 // cp only with flash attention
  ep_divides_experts,             // MoE: ep divides num_experts and tp·cp·dp (expert folding)
  ep_needs_moe,                   // ep > 1 pinned for a dense model (no experts to split)
  moe_not_planned,                // MoE: a lever the planner refuses for MoE (docs/moe.md)
  mla_mtp_not_planned,            // MLA / MTP: selective_op with MLA, tp or cp > 1 with MTP
  dualpipe_pp,                    // dualpipe: pp even (>= 2)
  dualpipe_microbatches,          // dualpipe: an even number of micro-batches, at least 2 pp
  dualpipe_not_planned,           // dualpipe: ZeRO-2/3 or tied embeddings (validate refuses)
  peft_not_planned,               // fine-tuning: a lever validate refuses with training.peft
  // What training.framework does not run (planner/capabilities.h; docs/frameworks.md).
  framework_schedule,   // a pipeline schedule
  framework_sharding,   // a ZeRO stage, hybrid shard or offload, alone or with tp / pp
  framework_parallel,   // tp, sp, cp or ep, alone or with pp
  framework_recompute,  // a recompute policy
  framework_split,      // an uneven pipeline split it cannot be told
  // Constraints (liftable).
  tp_within_node,
  pp_divides_layers,
  sequence_parallel_needs_tp,
  zero_needs_dp,
  single_schedule_without_pp,
  interleaved_needs_pp,
  whole_nodes,
  max_micro_batch_size,
  min_tokens_per_cp_rank,
  // Evaluation.
  invalid_scenario,  // validate_scenario() refused a returned plan (a bug if non-zero)
  out_of_memory,     // peak above capacity x (1 - memory_margin)
  below_target,      // objective "gpus": under the target throughput
  count_
};
inline constexpr int kNumRejects = static_cast<int>(Reject::count_);
[[nodiscard]] std::string_view to_string(Reject r) noexcept;
using RejectCounts = std::array<std::uint64_t, kNumRejects>;

/// Candidate values per dimension; an empty list means "every value the space allows".
struct Candidates {
  std::vector<Count> tp, pp, dp, virtual_stages, fsdp_shard_size, micro_batch_size, cp, ep, etp;
  std::vector<int> zero_stage;
  std::vector<bool> sequence_parallel;
  std::vector<Recompute> recompute;
  std::vector<Schedule> schedule;
  std::vector<SplitChoice> split;  // empty: both where pp > 1 and they differ
  bool operator==(const Candidates&) const = default;
};

struct Space {
  Scenario base;  // model, cluster, training, assumptions; `parallel` and micro-batch are replaced
  Candidates candidates;
  Constraints constraints;
  /// false: dp = num_gpus / (tp*pp) (every layout uses the whole cluster); true: any dp dividing
  /// the global batch with tp*pp*dp <= num_gpus (objective "gpus").
  bool fewer_gpus = false;
};

/// The layout's `parallel` as the planner spells it (fsdp_shard_size = dp when not hybrid).
[[nodiscard]] ParallelSpec parallel_of(const Layout& layout);

/// The scenario of one layout: base with `parallel`, micro-batch size and GPU count replaced.
[[nodiscard]] Scenario make_scenario(const Scenario& base, const Layout& layout);
/// In-place variant for hot loops (no allocation when base has no explicit layers_per_stage).
void apply_layout(Scenario& s, const Layout& layout) noexcept;

/// The outer (tp, pp, dp, micro-batch) combinations that pass every constraint at that level; the
/// unit of work of a parallel search. Cuts are added to `rejected`.
struct Outer {
  Count tp, pp, dp, micro_batch_size;
  Count cp = 1;
  Count ep = 1;
  Count etp = 1;
};
[[nodiscard]] std::vector<Outer> enumerate_outer(const Space& space, RejectCounts& rejected);

/// The most layouts one search enumerates: 10^8, about 80 s on one core at the benchmarked
/// 1.29 M estimates/s (bench/search_bench), seconds on a many-core host (docs/trust.md).
inline constexpr std::uint64_t kMaxLayouts = 100'000'000;

/// How many layouts the space holds (what enumerate_layouts would list), counted per outer
/// combination from the inner lists without building either; stops once past `stop_above`.
[[nodiscard]] std::uint64_t count_layouts(const Space& space,
                                          std::uint64_t stop_above = kMaxLayouts);

/// Calls fn(const Layout&) for every layout under one outer combination; cuts go to `rejected`.
/// Order: schedule, virtual stages, ZeRO stage, shard size, recompute, sequence parallel.
template <class Fn>
void for_each_inner(const Space& space, const Outer& o, RejectCounts& rejected, Fn&& fn);

/// Every layout of the space, in enumeration order (for tests and small spaces).
[[nodiscard]] std::vector<Layout> enumerate_layouts(const Space& space, RejectCounts& rejected);

// ---- implementation details of the inner enumeration (header so the loop inlines) ----------
namespace detail {
struct InnerLists {
  std::vector<Schedule> schedules;
  std::vector<Count> virtual_stages;  // for interleaved schedules (v >= 2)
  std::vector<int> zero_stages;
  std::vector<Count> shard_sizes;  // for ZeRO >= 1: 0 (the whole dp group), then hybrid sizes
  std::vector<Recompute> recompute;
  std::vector<bool> sequence_parallel;
  std::array<bool, 4> hybrid{};  // by ZeRO stage: hybrid shard sizes the framework runs
  // ZeRO-1/2 only with the interleaved schedule (the framework's gather behind the next forward,
  // assumptions.overlap_param_gather_after_step, needs it).
  bool zero12_needs_interleaved = false;
  // Experts folded into the ZeRO shard group (torchtitan): ep divides shard_base times the
  // shard's data-parallel ranks (1 at ZeRO-0). expert_group 1: no such rule.
  Count expert_group = 1;
  Count shard_base = 1;
  [[nodiscard]] bool experts_fold(Count shard_dp) const noexcept {
    return expert_group <= 1 || (shard_base * shard_dp) % expert_group == 0;
  }
};
void inner_lists(const Space& space, const Outer& o, RejectCounts& rejected, InnerLists& out);
/// The splits the layout (pp, schedule, v) takes: even where the layers fill every virtual stage,
/// light_ends where pp > 1 and the layers with the embedding and the head fill them (and the
/// split differs from the even one); both filtered by the pinned candidates. At most 2.
struct SplitChoices {
  SplitChoice choice[2]{};
  int n = 0;
};
[[nodiscard]] SplitChoices split_choices(const Space& space, Count pp, Schedule schedule,
                                         Count v) noexcept;
[[nodiscard]] inline bool is_interleaved(Schedule s) noexcept {
  return s == Schedule::interleaved_1f1b;
}
}  // namespace detail

template <class Fn>
void for_each_inner(const Space& space, const Outer& o, RejectCounts& rejected, Fn&& fn) {
  thread_local detail::InnerLists lists;
  detail::inner_lists(space, o, rejected, lists);
  Layout l;
  l.tp = o.tp;
  l.pp = o.pp;
  l.dp = o.dp;
  l.micro_batch_size = o.micro_batch_size;
  l.cp = o.cp;
  l.ep = o.ep;
  l.etp = o.etp;
  static const std::vector<Count> kOne{1};
  static const std::vector<Count> kTwo{2};  // a V: exactly two chunks per stage
  for (Schedule sched : lists.schedules) {
    l.schedule = sched;
    const auto& vs = detail::is_interleaved(sched) ? lists.virtual_stages
                     : two_chunks(sched)           ? kTwo
                                                   : kOne;
    const bool zero01_only = bidirectional(sched);  // dualpipe: ZeRO 0/1 (validate_scenario)
    for (Count v : vs) {
      l.virtual_stages = v;
      const detail::SplitChoices splits = detail::split_choices(space, o.pp, sched, v);
      if (splits.n == 0) {
        ++rejected[static_cast<int>(Reject::too_few_layers)];
        continue;
      }
      for (int z : lists.zero_stages) {
        if (zero01_only && z >= 2) {
          ++rejected[static_cast<int>(Reject::dualpipe_not_planned)];
          continue;
        }
        if (lists.zero12_needs_interleaved && (z == 1 || z == 2) &&
            !detail::is_interleaved(sched)) {
          ++rejected[static_cast<int>(Reject::framework_sharding)];
          continue;
        }
        l.zero_stage = z;
        if (z == 0 && !lists.experts_fold(1)) {
          ++rejected[static_cast<int>(Reject::framework_parallel)];
          continue;
        }
        const std::size_t num_shards = z == 0 ? 1 : lists.shard_sizes.size();
        for (std::size_t si = 0; si < num_shards; ++si) {
          l.fsdp_shard_size = z == 0 ? 0 : lists.shard_sizes[si];
          if (l.fsdp_shard_size != 0 && !lists.hybrid[static_cast<std::size_t>(z)]) {
            ++rejected[static_cast<int>(Reject::framework_sharding)];
            continue;
          }
          if (z > 0 && !lists.experts_fold(l.fsdp_shard_size == 0 ? l.dp : l.fsdp_shard_size)) {
            ++rejected[static_cast<int>(Reject::framework_parallel)];
            continue;
          }
          for (Recompute r : lists.recompute) {
            l.recompute = r;
            for (bool sp : lists.sequence_parallel) {
              l.sequence_parallel = sp;
              for (int k = 0; k < splits.n; ++k) {
                l.split = splits.choice[k];
                fn(static_cast<const Layout&>(l));
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace distplan::search
