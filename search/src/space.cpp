#include "distplan/search/space.h"

#include <algorithm>

#include "distplan/planner/capabilities.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan::search {

std::string_view to_string(Reject r) noexcept {
  switch (r) {
    case Reject::gpus_not_divisible:
      return "gpus_not_divisible";
    case Reject::tp_divides_heads:
      return "tp_divides_heads";
    case Reject::tp_divides_ffn:
      return "tp_divides_ffn";
    case Reject::pp_exceeds_layers:
      return "pp_exceeds_layers";
    case Reject::batch_not_divisible:
      return "batch_not_divisible";
    case Reject::too_few_layers:
      return "too_few_layers";
    case Reject::virtual_stages_uneven:
      return "virtual_stages_uneven";
    case Reject::interleaved_microbatches:
      return "interleaved_microbatches";
    case Reject::sequence_parallel_divides_seq:
      return "sequence_parallel_divides_seq";
    case Reject::shard_not_divisor:
      return "shard_not_divisor";
    case Reject::v_shape_microbatches:
      return "v_shape_microbatches";
    case Reject::cp_divides_seq:
      return "cp_divides_seq";
    case Reject::cp_divides_heads:
      return "cp_divides_heads";
    case Reject::cp_needs_flash:
      return "cp_needs_flash";
    case Reject::ep_divides_experts:
      return "ep_divides_experts";
    case Reject::ep_needs_moe:
      return "ep_needs_moe";
    case Reject::dualpipe_pp:
      return "dualpipe_pp";
    case Reject::dualpipe_microbatches:
      return "dualpipe_microbatches";
    case Reject::dualpipe_not_planned:
      return "dualpipe_not_planned";
    case Reject::peft_not_planned:
      return "peft_not_planned";
    case Reject::framework_schedule:
      return "framework_schedule";
    case Reject::framework_sharding:
      return "framework_sharding";
    case Reject::framework_parallel:
      return "framework_parallel";
    case Reject::framework_recompute:
      return "framework_recompute";
    case Reject::framework_split:
      return "framework_split";
    case Reject::moe_not_planned:
      return "moe_not_planned";
    case Reject::mla_mtp_not_planned:
      return "mla_mtp_not_planned";
    case Reject::tp_within_node:
      return "tp_within_node";
    case Reject::pp_divides_layers:
      return "pp_divides_layers";
    case Reject::sequence_parallel_needs_tp:
      return "sequence_parallel_needs_tp";
    case Reject::zero_needs_dp:
      return "zero_needs_dp";
    case Reject::single_schedule_without_pp:
      return "single_schedule_without_pp";
    case Reject::interleaved_needs_pp:
      return "interleaved_needs_pp";
    case Reject::whole_nodes:
      return "whole_nodes";
    case Reject::max_micro_batch_size:
      return "max_micro_batch_size";
    case Reject::min_tokens_per_cp_rank:
      return "min_tokens_per_cp_rank";
    case Reject::invalid_scenario:
      return "invalid_scenario";
    case Reject::out_of_memory:
      return "out_of_memory";
    case Reject::below_target:
      return "below_target";
    case Reject::count_:
      break;
  }
  return "?";
}

std::string_view to_string(SplitChoice c) noexcept {
  return c == SplitChoice::even ? "even" : "light_ends";
}

namespace {

// The layout's split as the framework writes it: Megatron-LM's account-for flags where its
// divisibility rules hold, torchtitan's rule (its defaults, weights 1 and 1) for torchtitan runs
// (not DualPipe), else the same counts as an explicit split.
void apply_split(Scenario& s, SplitChoice choice) {
  PipelineSplitSpec& x = s.parallel.split;
  x = PipelineSplitSpec{};
  const ParallelSpec& p = s.parallel;
  const Count layers = s.model.num_layers;
  const Count path = path_length(p.schedule, p.pp, p.virtual_stages);
  // (A layout without a model, parallel_of(), or one no split fills keeps the even rule.)
  if (choice == SplitChoice::even || layers <= 0 || layers + 2 < path) return;
  const bool megatron_fits = !two_chunks(p.schedule) && (layers + 2) % p.pp == 0 &&
                             ((layers + 2) / p.pp) % p.virtual_stages == 0 &&
                             (layers + 2) / path >= 1;
  if (s.training.framework == Framework::megatron && megatron_fits) {
    x.rule = SplitRule::megatron;
    x.account_for_embedding = x.account_for_loss = true;
  } else if (s.training.framework == Framework::torchtitan && !bidirectional(p.schedule)) {
    x.rule = SplitRule::torchtitan;
  } else {
    x.rule = SplitRule::explicit_layers;
    x.layers = torchtitan_split(layers, path, 1, 1, "/parallel/layers_per_virtual_stage");
  }
}

}  // namespace

void apply_layout(Scenario& s, const Layout& l) noexcept {
  ParallelSpec& p = s.parallel;
  p.tp = l.tp;
  p.cp = l.cp;
  p.ep = l.ep;
  p.etp = l.etp;
  p.pp = l.pp;
  p.dp = l.dp;
  p.zero_stage = l.zero_stage;
  p.fsdp_shard_size = l.fsdp_shard_size > 0 ? l.fsdp_shard_size : l.dp;
  p.sequence_parallel = l.sequence_parallel;
  p.recompute = l.recompute;
  p.schedule = l.schedule;
  p.virtual_stages = l.virtual_stages;
  p.layers_per_stage.clear();
  apply_split(s, l.split);
  s.training.micro_batch_size = l.micro_batch_size;
  s.cluster.num_gpus = l.num_gpus();
}

ParallelSpec parallel_of(const Layout& layout) {
  Scenario s;
  apply_layout(s, layout);
  return s.parallel;
}

Scenario make_scenario(const Scenario& base, const Layout& layout) {
  Scenario s = base;
  apply_layout(s, layout);
  return s;
}

namespace {

void bump(RejectCounts& r, Reject why) {
  ++r[static_cast<int>(why)];
}

template <class T>
bool allowed(const std::vector<T>& pinned, const T& value) {
  return pinned.empty() || std::find(pinned.begin(), pinned.end(), value) != pinned.end();
}

std::vector<Count> divisors(Count n) {
  std::vector<Count> small, large;
  for (Count d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    small.push_back(d);
    if (d * d != n) large.push_back(n / d);
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

std::vector<Count> range(Count lo, Count hi) {
  std::vector<Count> v;
  for (Count i = lo; i <= hi; ++i) v.push_back(i);
  return v;
}

}  // namespace

namespace {

// Calls fn(const Outer&) for each outer combination that passes every constraint at that level,
// until fn returns false; cuts go to `rejected`.
template <class Fn>
void walk_outer(const Space& space, RejectCounts& rejected, Fn&& fn) {
  const Scenario& b = space.base;
  const Constraints& c = space.constraints;
  const Candidates& pin = space.candidates;
  const Count n = b.cluster.num_gpus;
  const Count gpn = b.cluster.gpus_per_node;
  const Count layers = b.model.num_layers;
  const Count batch = b.training.global_batch_size;
  if (n <= 0 || batch <= 0 || layers <= 0) return;
  // What the framework runs (capabilities.h): the same rows validate_scenario() refuses by.
  const FrameworkCapabilities& caps = capabilities(b.training.framework);

  const std::vector<Count> tps =
      !pin.tp.empty() ? pin.tp : (space.fewer_gpus ? range(1, n) : divisors(n));
  for (Count tp : tps) {
    if (tp < 1 || tp > n || (!space.fewer_gpus && n % tp != 0)) {
      bump(rejected, Reject::gpus_not_divisible);
      continue;
    }
    if (c.tp_within_node && (tp > gpn || gpn % tp != 0)) {
      bump(rejected, Reject::tp_within_node);
      continue;
    }
    if (b.model.num_attention_heads % tp != 0 || b.model.num_kv_heads % tp != 0) {
      bump(rejected, Reject::tp_divides_heads);
      continue;
    }
    if (tp > 1 && b.model.mtp_layers > 0) {  // MTP's TP exchanges: refused (docs/moe.md)
      bump(rejected, Reject::mla_mtp_not_planned);
      continue;
    }
    if (b.model.ffn_hidden_size % tp != 0) {
      bump(rejected, Reject::tp_divides_ffn);
      continue;
    }
    // Fine-tuning (validate.cpp, check_peft): adapters only without tensor parallelism.
    const PeftSpec& peft = b.training.peft;
    if (peft.adapters() && tp > 1) {
      bump(rejected, Reject::peft_not_planned);
      continue;
    }
    if (tp > 1 && (!caps.tensor_parallel.runs ||
                   (b.assumptions.tp_comm_overlap && !caps.tp_comm_overlap.runs))) {
      bump(rejected, Reject::framework_parallel);
      continue;
    }
    // Context parallel, next in the rank order (docs/layout.md): the values validate.cpp accepts.
    const std::vector<Count> cps = !pin.cp.empty()    ? pin.cp
                                   : space.fewer_gpus ? range(1, n / tp)
                                                      : divisors(n / tp);
    for (Count cp : cps) {
      if (cp < 1 || tp * cp > n || (!space.fewer_gpus && (n / tp) % cp != 0)) {
        bump(rejected, Reject::gpus_not_divisible);
        continue;
      }
      if (cp > 1 && peft.enabled()) {
        bump(rejected, Reject::peft_not_planned);
        continue;
      }
      if (cp > 1 && b.model.mtp_layers > 0) {  // MTP's shift across CP ranks: refused
        bump(rejected, Reject::mla_mtp_not_planned);
        continue;
      }
      if (cp > 1) {
        const Count seq = b.training.seq_length;
        const bool a2a = b.parallel.cp_comm == CpComm::a2a;
        if (b.training.attention != Attention::flash) {
          bump(rejected, Reject::cp_needs_flash);
          continue;
        }
        if (seq % (a2a ? cp : 2 * cp) != 0) {
          bump(rejected, Reject::cp_divides_seq);
          continue;
        }
        if (a2a && ((b.model.num_attention_heads / tp) % cp != 0 ||
                    (b.model.num_kv_heads / tp) % cp != 0)) {
          bump(rejected, Reject::cp_divides_heads);
          continue;
        }
        if (c.min_tokens_per_cp_rank > 0 && seq / cp < c.min_tokens_per_cp_rank) {
          bump(rejected, Reject::min_tokens_per_cp_rank);
          continue;
        }
        if (!caps.context_parallel[static_cast<std::size_t>(b.parallel.cp_comm)].runs) {
          bump(rejected, Reject::framework_parallel);
          continue;
        }
      }
      const Count tc = tp * cp;
      const std::vector<Count> pps = !pin.pp.empty() ? pin.pp : range(1, std::min(layers, n / tc));
      for (Count pp : pps) {
        if (pp < 1 || tc * pp > n || (!space.fewer_gpus && (n / tc) % pp != 0)) {
          bump(rejected, Reject::gpus_not_divisible);
          continue;
        }
        if (pp > layers) {
          bump(rejected, Reject::pp_exceeds_layers);
          continue;
        }
        if (c.pp_divides_layers && layers % pp != 0) {
          bump(rejected, Reject::pp_divides_layers);
          continue;
        }
        if (pp > 1 && tp > 1 && !caps.pipeline_with_tensor_parallel.runs) {
          bump(rejected, Reject::framework_parallel);
          continue;
        }
        if (pp > 1 && layers % pp != 0 && caps.split != SplitSupport::any) {
          // The planner's even split (stage_layer_counts) in the framework's terms.
          Scenario x = b;
          x.parallel.pp = pp;
          x.parallel.layers_per_stage.clear();
          if (!split_expressible(x, caps.split)) {
            bump(rejected, Reject::framework_split);
            continue;
          }
        }
        std::vector<Count> dps;
        if (!space.fewer_gpus) {
          dps = {n / (tc * pp)};
        } else {
          dps = !pin.dp.empty() ? pin.dp : divisors(batch);
        }
        for (Count dp : dps) {
          if (!allowed(pin.dp, dp)) continue;  // a pin, not a rejection
          if (dp < 1 || tc * pp * dp > n) {
            bump(rejected, Reject::gpus_not_divisible);
            continue;
          }
          if (batch % dp != 0) {
            bump(rejected, Reject::batch_not_divisible);
            continue;
          }
          const Count gpus = tc * pp * dp;
          if (space.fewer_gpus && c.whole_nodes && gpus > gpn && gpus % gpn != 0) {
            bump(rejected, Reject::whole_nodes);
            continue;
          }
          const std::vector<Count> mbs =
              !pin.micro_batch_size.empty() ? pin.micro_batch_size : divisors(batch / dp);
          for (Count mb : mbs) {
            if (mb < 1 || batch % (dp * mb) != 0) {
              bump(rejected, Reject::batch_not_divisible);
              continue;
            }
            if (c.max_micro_batch_size > 0 && mb > c.max_micro_batch_size) {
              bump(rejected, Reject::max_micro_batch_size);
              continue;
            }
            // Expert parallel, last: the expert layers regroup a stage's tp·cp·dp ranks as
            // etp · ep · edp (Megatron-Core's MoE parallel folding, validate.cpp); etp is 1
            // unless pinned.
            const bool moe = b.model.moe.enabled();
            const std::vector<Count> eps = !pin.ep.empty() ? pin.ep
                                           : moe           ? divisors(b.model.moe.num_experts)
                                                           : std::vector<Count>{1};
            const std::vector<Count> etps = !pin.etp.empty() ? pin.etp : std::vector<Count>{1};
            for (Count ep : eps) {
              // A dense model has no experts to split: its own reason, not a divisibility one
              // (issue 29, item 15).
              if (ep > 1 && !moe) {
                bump(rejected, Reject::ep_needs_moe);
                continue;
              }
              if (ep < 1 ||
                  (ep > 1 && (b.model.moe.num_experts % ep != 0 || (tc * dp) % ep != 0))) {
                bump(rejected, Reject::ep_divides_experts);
                continue;
              }
              if (ep > 1 && !caps.expert_parallel.runs) {
                bump(rejected, Reject::framework_parallel);
                continue;
              }
              for (Count etp : etps) {
                if (etp < 1 ||
                    (etp > 1 && (!moe || (tc * dp) % (ep * etp) != 0 ||
                                 b.model.moe.expert_ffn_hidden_size % etp != 0 || b.model.bias))) {
                  bump(rejected, Reject::ep_divides_experts);
                  continue;
                }
                if (etp > 1 && !(etp == tp ? caps.expert_tensor_parallel_equal_tp
                                           : caps.expert_tensor_parallel_other)
                                    .runs) {
                  bump(rejected, Reject::framework_parallel);
                  continue;
                }
                if (!fn(Outer{tp, pp, dp, mb, cp, ep, etp})) return;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

std::vector<Outer> enumerate_outer(const Space& space, RejectCounts& rejected) {
  std::vector<Outer> out;
  walk_outer(space, rejected, [&](const Outer& o) {
    out.push_back(o);
    return true;
  });
  return out;
}

namespace detail {

void inner_lists(const Space& space, const Outer& o, RejectCounts& rejected, InnerLists& out) {
  const Scenario& b = space.base;
  const Constraints& c = space.constraints;
  const Candidates& pin = space.candidates;
  const Count layers = b.model.num_layers;
  const Count m = b.training.global_batch_size / (o.dp * o.micro_batch_size);
  const FrameworkCapabilities& caps = capabilities(b.training.framework);

  // zb_auto is searched only when named in parallel.schedule: its heuristic runs for every layout
  // whose peak the lean path cannot bound (docs/search.md), a hundred times an estimate's cost.
  // dualpipe is opt-in too: the default space stays as it was (dualpipe_v, its cut-in-half with
  // one parameter copy, is in it).
  static constexpr Schedule kAllSchedules[] = {
      Schedule::one_f_one_b, Schedule::gpipe, Schedule::interleaved_1f1b,
      Schedule::zb_h1,       Schedule::zb_h2, Schedule::zb_v,
      Schedule::v_half,      Schedule::v_min, Schedule::dualpipe_v};
  out.schedules.clear();
  out.virtual_stages.clear();
  const bool flat_allowed = allowed(pin.virtual_stages, Count{1});
  bool have_flat = false;
  const PeftSpec& peft = b.training.peft;
  auto consider = [&](Schedule s) {
    // Fine-tuning: no DualPipe; frozen layers only with one chunk per stage (check_peft).
    if (peft.enabled() && (bidirectional(s) ||
                           (peft.frozen_layers > 0 && (detail::is_interleaved(s) || v_shape(s))))) {
      bump(rejected, Reject::peft_not_planned);
      return;
    }
    // The schedule, and the send/receive overlap the scenario assumes with it.
    const Assumptions& a = b.assumptions;
    const bool interleaved = detail::is_interleaved(s);
    if (!caps.schedule[static_cast<std::size_t>(s)].runs ||
        (o.pp > 1 && a.overlap_p2p &&
         !(interleaved ? caps.overlap_p2p_interleaved : caps.overlap_p2p).runs) ||
        (interleaved && o.pp == 2 && !a.overlap_p2p &&
         !caps.interleaved_pp2_without_p2p_overlap.runs)) {
      bump(rejected, Reject::framework_schedule);
      return;
    }
    if (detail::is_interleaved(s)) {
      if (o.pp == 1 && c.interleaved_needs_pp) {
        bump(rejected, Reject::interleaved_needs_pp);
        return;
      }
      if (m % o.pp != 0) {
        bump(rejected, Reject::interleaved_microbatches);
        return;
      }
    } else if (bidirectional(s)) {
      // DualPipe: validate_scenario's rules (deepseek-ai/DualPipe dualpipe.py asserts
      // num_ranks % 2 == 0, num_chunks % 2 == 0 and num_chunks >= 2 num_ranks; stage s holds
      // model stages s and pp - 1 - s, equal; untied embeddings; ZeRO 0/1 in for_each_inner).
      if (!allowed(pin.virtual_stages, Count{2})) return;
      if (b.model.tied_embeddings) {
        bump(rejected, Reject::dualpipe_not_planned);
        return;
      }
      if (o.pp < 2 || o.pp % 2 != 0) {
        bump(rejected, Reject::dualpipe_pp);
        return;
      }
      if (m % 2 != 0 || m < 2 * o.pp) {
        bump(rejected, Reject::dualpipe_microbatches);
        return;
      }
    } else if (v_shape(s)) {
      // Two chunks per stage in a V (validate_scenario's rules for the V schedules).
      if (!allowed(pin.virtual_stages, Count{2})) return;
      if (o.pp == 1 && c.single_schedule_without_pp) {
        bump(rejected, Reject::single_schedule_without_pp);
        return;
      }
      if (m < 2 * o.pp) {
        bump(rejected, Reject::v_shape_microbatches);
        return;
      }
    } else {
      if (!flat_allowed) return;  // a pinned v > 1 excludes the flat schedules
      if (o.pp == 1 && c.single_schedule_without_pp && have_flat) {
        bump(rejected, Reject::single_schedule_without_pp);
        return;
      }
      have_flat = true;
    }
    out.schedules.push_back(s);
  };
  if (pin.schedule.empty()) {
    for (Schedule s : kAllSchedules) consider(s);
  } else {
    for (Schedule s : pin.schedule) consider(s);
  }
  if (std::any_of(out.schedules.begin(), out.schedules.end(), detail::is_interleaved)) {
    // Any v whose virtual stages some split fills: at most (layers + 2) / pp chunks per stage
    // (the light ends' split, embedding and head counted as layers).
    const std::vector<Count> vs =
        !pin.virtual_stages.empty() ? pin.virtual_stages : range(2, (layers + 2) / o.pp);
    for (Count v : vs) {
      if (v < 2) continue;  // v = 1 is the flat schedule
      // Unpinned, v is searched where a split gives every virtual stage the same layers (the
      // even rule with pp·v | L, or the light ends with pp·v | L + 2): every other v gives some
      // chunks one layer more than others, multiplies the space (and the walks that rank it) by
      // the number of chunk counts, and an interleaved schedule gains least where its chunks are
      // unequal. Pinned, any v a split fills is searched.
      if (pin.virtual_stages.empty() && layers % (o.pp * v) != 0 &&
          (layers + 2) % (o.pp * v) != 0) {
        bump(rejected, Reject::virtual_stages_uneven);
        continue;
      }
      if (split_choices(space, o.pp, Schedule::interleaved_1f1b, v).n == 0) {
        bump(rejected, Reject::too_few_layers);
        continue;
      }
      out.virtual_stages.push_back(v);
    }
    if (out.virtual_stages.empty()) {
      std::erase_if(out.schedules, detail::is_interleaved);
    }
  }

  out.zero_stages.clear();
  const std::vector<int> zs =
      !pin.zero_stage.empty() ? pin.zero_stage : std::vector<int>{0, 1, 2, 3};
  const bool moe = b.model.moe.enabled();
  for (int z : zs) {
    if (z > 0 && o.dp * o.cp == 1 && c.zero_needs_dp) {  // ZeRO shards over dp·cp
      bump(rejected, Reject::zero_needs_dp);
      continue;
    }
    // The base's offload stays; it needs ZeRO (ZeRO-3 for parameters or NVMe, validate.cpp).
    const ParallelSpec& bp = b.parallel;
    const bool needs_zero3 =
        bp.offload_params != Offload::none || bp.offload_optimizer == Offload::nvme;
    if ((bp.offload_optimizer != Offload::none && z == 0) || (needs_zero3 && z != 3)) {
      bump(rejected, Reject::invalid_scenario);
      continue;
    }
    const auto zi = static_cast<std::size_t>(z);
    const bool replicas_beside_model_parallel =
        z == 0 && o.dp > 1 && (o.tp > 1 || o.cp > 1 || o.pp > 1 || o.ep > 1);
    if (!caps.zero_stage[zi].runs || (o.pp > 1 && !caps.sharding_with_pipeline[zi].runs) ||
        (o.tp > 1 && !caps.sharding_with_tensor_parallel[zi].runs) ||
        (replicas_beside_model_parallel && !caps.replicas_with_model_parallel.runs) ||
        (z == 0 && o.cp > 1 && !caps.unsharded_with_context_parallel.runs) ||
        (bp.offload_optimizer != Offload::none && !caps.offload_with_zero[zi].runs) ||
        ((z == 1 || z == 2) && b.assumptions.overlap_param_gather_after_step &&
         !caps.overlap_param_gather_after_step.runs)) {
      bump(rejected, Reject::framework_sharding);
      continue;
    }
    out.zero_stages.push_back(z);
  }

  for (std::size_t z = 0; z < out.hybrid.size(); ++z) out.hybrid[z] = caps.hybrid_shard[z].runs;
  out.zero12_needs_interleaved = b.assumptions.overlap_param_gather_after_step &&
                                 !caps.overlap_param_gather_after_step_flat.runs;
  out.expert_group = o.ep > 1 && !caps.expert_parallel_beyond_shard.runs ? o.ep : 1;
  out.shard_base = o.tp * o.cp;
  out.shard_sizes.clear();
  if (!pin.fsdp_shard_size.empty()) {
    for (Count s : pin.fsdp_shard_size) {
      const Count canonical = s == o.dp ? 0 : s;
      if (canonical != 0 && (s < 1 || s > o.dp || o.dp % s != 0)) {
        bump(rejected, Reject::shard_not_divisor);
        continue;
      }
      if (std::find(out.shard_sizes.begin(), out.shard_sizes.end(), canonical) ==
          out.shard_sizes.end()) {
        out.shard_sizes.push_back(canonical);
      }
    }
  } else {
    out.shard_sizes.push_back(0);
    // Hybrid shards of 2 .. dp/2 GPUs; a shard of 1 is ZeRO-0 and is already in the space.
    if (c.hybrid_shard && !moe) {  // hybrid sharding of experts: refused (docs/moe.md)
      for (Count d : divisors(o.dp)) {
        if (d >= 2 && d < o.dp) out.shard_sizes.push_back(d);
      }
    }
  }
  if (out.shard_sizes.empty()) std::erase_if(out.zero_stages, [](int z) { return z > 0; });

  // Selective recompute drops only the s x s attention tensors of standard attention (the layer
  // op table); with flash attention it is the same layout as none, so it is not enumerated twice.
  if (!pin.recompute.empty()) {
    out.recompute = pin.recompute;
  } else if (b.training.attention == Attention::flash) {
    out.recompute = {Recompute::none, Recompute::full};
  } else {
    out.recompute = {Recompute::none, Recompute::selective, Recompute::full};
  }
  // torchtitan's per-op selective checkpointing exists only there: enumerated for torchtitan runs.
  if (pin.recompute.empty() && b.training.framework == Framework::torchtitan && !moe) {
    out.recompute.push_back(Recompute::selective_op);
  }
  if (moe && std::erase(out.recompute, Recompute::selective_op) > 0)
    bump(rejected, Reject::moe_not_planned);
  if (b.model.mla.enabled() && std::erase(out.recompute, Recompute::selective_op) > 0)
    bump(rejected, Reject::mla_mtp_not_planned);
  if (b.training.peft.enabled() && std::erase(out.recompute, Recompute::selective_op) > 0)
    bump(rejected, Reject::peft_not_planned);
  const auto unsupported = std::erase_if(out.recompute, [&](Recompute r) {
    return !caps.recompute[static_cast<std::size_t>(r)].runs;
  });
  for (std::size_t i = 0; i < unsupported; ++i) bump(rejected, Reject::framework_recompute);

  out.sequence_parallel.clear();
  const std::vector<bool> sps =
      !pin.sequence_parallel.empty() ? pin.sequence_parallel : std::vector<bool>{false, true};
  for (bool sp : sps) {
    if (moe && !sp && o.tp > 1) {  // Megatron-LM requires SP with MoE and tp > 1
      bump(rejected, Reject::moe_not_planned);
      continue;
    }
    if (sp && o.tp == 1 && c.sequence_parallel_needs_tp) {
      bump(rejected, Reject::sequence_parallel_needs_tp);
      continue;
    }
    if (o.tp > 1 &&
        (!(sp ? caps.sequence_parallel : caps.tensor_parallel_without_sp).runs ||
         (!sp && b.assumptions.tp_comm_overlap && !caps.tp_comm_overlap_without_sp.runs))) {
      bump(rejected, Reject::framework_parallel);
      continue;
    }
    // Under context parallelism each of the 2·cp (a2a: cp) chunks is split over tp again.
    const Count chunks = o.cp == 1 ? 1 : (b.parallel.cp_comm == CpComm::a2a ? o.cp : 2 * o.cp);
    if (sp && b.training.seq_length % (o.tp * chunks) != 0) {
      bump(rejected, Reject::sequence_parallel_divides_seq);
      continue;
    }
    out.sequence_parallel.push_back(sp);
  }
}

}  // namespace detail

namespace detail {

SplitChoices split_choices(const Space& space, Count pp, Schedule schedule, Count v) noexcept {
  const Count layers = space.base.model.num_layers;
  const Count path = path_length(schedule, pp, v);
  const std::vector<SplitChoice>& pin = space.candidates.split;
  SplitChoices out;
  // The even rule needs a layer on every virtual stage (pipeline_split.cpp).
  if (layers >= path && allowed(pin, SplitChoice::even)) out.choice[out.n++] = SplitChoice::even;
  // Lighter ends: torchtitan's rule with weights 1 and 1 needs (L + 2) / path >= 1.
  // A framework told only its partitioner's own split (DeepSpeed) runs the even one alone.
  const bool told_splits =
      capabilities(space.base.training.framework).split != SplitSupport::even_only;
  // Only where it differs from the even split (32 layers on 2 stages: 16 and 16 both ways).
  auto differs = [&] {
    try {
      return torchtitan_split(layers, path, 1, 1, "") != even_split(layers, path);
    } catch (const InputError&) {
      return false;
    }
  };
  if (pp > 1 && told_splits && layers + 2 >= path && allowed(pin, SplitChoice::light_ends) &&
      differs()) {
    out.choice[out.n++] = SplitChoice::light_ends;
  }
  return out;
}

}  // namespace detail

std::uint64_t count_layouts(const Space& space, std::uint64_t stop_above) {
  RejectCounts scratch{};
  detail::InnerLists lists;
  std::uint64_t total = 0;
  walk_outer(space, scratch, [&](const Outer& o) {
    detail::inner_lists(space, o, scratch, lists);
    std::uint64_t zero = 0;       // (ZeRO stage, shard) pairs, as for_each_inner walks them
    std::uint64_t zero01 = 0;     // the pairs of ZeRO 0/1 (dualpipe's)
    std::uint64_t zero_flat = 0;  // the pairs a schedule other than interleaved takes
    for (int z : lists.zero_stages) {
      // The whole-group shard (0) always; hybrid sizes where the framework runs them; experts
      // folded into the shard group where the framework needs it.
      std::uint64_t pairs = 0;
      if (z == 0) {
        pairs = lists.experts_fold(1) ? 1 : 0;
      } else {
        for (Count sh : lists.shard_sizes) {
          if (sh != 0 && !lists.hybrid[static_cast<std::size_t>(z)]) continue;
          if (lists.experts_fold(sh == 0 ? o.dp : sh)) ++pairs;
        }
      }
      // ZeRO-1/2 outside the interleaved schedule are skipped when the framework's gather
      // behind the next forward needs it (InnerLists::zero12_needs_interleaved).
      const bool flat_ok = !(lists.zero12_needs_interleaved && (z == 1 || z == 2));
      zero += pairs;
      if (flat_ok) zero_flat += pairs;
      if (z <= 1 && flat_ok) zero01 += pairs;
    }
    std::uint64_t pairs = 0;  // (schedule, v, split, ZeRO stage, shard)
    for (Schedule sched : lists.schedules) {
      const std::vector<Count> one{two_chunks(sched) ? 2 : 1};
      for (Count v : detail::is_interleaved(sched) ? lists.virtual_stages : one) {
        const auto splits =
            static_cast<std::uint64_t>(detail::split_choices(space, o.pp, sched, v).n);
        pairs += splits * (bidirectional(sched)            ? zero01
                           : detail::is_interleaved(sched) ? zero
                                                           : zero_flat);
      }
    }
    total += pairs * lists.recompute.size() * lists.sequence_parallel.size();
    return total <= stop_above;
  });
  return total;
}

std::vector<Layout> enumerate_layouts(const Space& space, RejectCounts& rejected) {
  std::vector<Layout> all;
  for (const Outer& o : enumerate_outer(space, rejected)) {
    for_each_inner(space, o, rejected, [&](const Layout& l) { all.push_back(l); });
  }
  return all;
}

}  // namespace distplan::search
