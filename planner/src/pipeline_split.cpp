// The frameworks' pipeline split rules (pipeline_split.h; docs/layout.md, "Pipeline splits").
#include "distplan/planner/pipeline_split.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"

namespace distplan {

Count PipelineSplit::virtual_stage(Count stage, Count chunk) const noexcept {
  if (bidirectional) return dualpipe_model_stage(pp, stage, chunk);
  return virtual_stage_of(v_shape, pp, stage, chunk);
}

Count PipelineSplit::stage_layers(Count stage) const noexcept {
  Count n = 0;
  for (Count c = 0; c < chunks; ++c) n += chunk_layers(stage, c);
  return n;
}

bool PipelineSplit::uniform() const noexcept {
  return std::adjacent_find(layers.begin(), layers.end(), std::not_equal_to<>()) == layers.end();
}

std::vector<Count> even_split(Count num_layers, Count n) {
  std::vector<Count> out(static_cast<std::size_t>(n), num_layers / n);
  // The remainder goes to the virtual stages between the ends first: the first also holds the
  // embedding and the last the final norm, LM head and loss.
  Count rest = num_layers % n;
  for (Count i = 1; i < n - 1 && rest > 0; ++i, --rest) ++out[static_cast<std::size_t>(i)];
  if (rest > 0) ++out.front(), --rest;
  if (rest > 0) ++out.back(), --rest;
  return out;
}

std::vector<Count> torchtitan_split(Count num_layers, Count n, Count input_weight,
                                    Count output_weight, const std::string& path) {
  // torchtitan/distributed/pipeline_parallel.py, _generate_llm_fqn_per_model_part (b5bcd76).
  if (n == 1) return {num_layers};  // a single stage gets everything
  const Count effective = num_layers + input_weight + output_weight;
  if (n > effective) {
    throw InputError(path, fmt::format("torchtitan refuses {} stages for {} effective layers "
                                       "(num_layers={} + first_stage_less_layers={} + "
                                       "last_stage_less_layers={}): \"Number of stages cannot be "
                                       "greater than effective layers\"",
                                       n, effective, num_layers, input_weight, output_weight));
  }
  const Count per_stage = effective / n;
  const Count extra = effective % n;
  if (input_weight > per_stage || output_weight > per_stage) {
    throw InputError(path,
                     fmt::format("torchtitan refuses a stage weight above the {} effective layers "
                                 "per stage (first_stage_less_layers={}, last_stage_less_layers="
                                 "{}): \"input_weight/output_weight exceeds minimum layers per "
                                 "stage\"",
                                 per_stage, input_weight, output_weight));
  }
  std::vector<Count> out(static_cast<std::size_t>(n));
  Count left = num_layers;
  for (Count i = 0; i < n; ++i) {
    Count here = per_stage + (i < extra ? 1 : 0);
    if (i == 0) here -= input_weight;
    if (i == n - 1) here -= output_weight;
    here = std::min(here, left);  // "if current_layer < num_layers"
    out[static_cast<std::size_t>(i)] = here;
    left -= here;
  }
  return out;
}

namespace {

// Megatron's parse_str_to_list: commas are cosmetic, "(...)*n" and "x*n" unrolled.
std::string unroll_layout(std::string_view in, const std::string& path) {
  std::string s;
  for (char c : in)
    if (c != ',' && c != ' ') s += c;
  auto read_count = [&](std::size_t& i) {
    if (i >= s.size() || s[i] != '*') return Count{1};
    ++i;
    Count n = 0;
    const std::size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && n < 100000) n = n * 10 + (s[i++] - '0');
    if (i == start || n > 100000)
      throw InputError(path, "a '*' in the layout must be followed by a count (at most 100000)");
    return n;
  };
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '(') {
      const std::size_t close = s.find(')', i);
      if (close == std::string::npos) throw InputError(path, "unbalanced '(' in the layout");
      const std::string body = s.substr(i + 1, close - i - 1);
      if (body.find('(') != std::string::npos)
        throw InputError(path, "the layout's groups cannot nest (Megatron unrolls one level)");
      i = close + 1;
      const Count n = read_count(i);
      for (Count k = 0; k < n; ++k) out += body;
    } else {
      const char c = s[i++];
      const Count n = read_count(i);
      out.append(static_cast<std::size_t>(n), c);
    }
    if (out.size() > 10000000) throw InputError(path, "the unrolled layout is too long");
  }
  return out;
}

}  // namespace

MegatronLayout parse_megatron_layout(std::string_view layout, Count pp, Count num_layers,
                                     Count mtp_layers, const std::string& path) {
  const std::string flat = unroll_layout(layout, path);
  // One list of layer kinds per virtual stage (stages split by '|').
  std::vector<std::string> stages(1);
  for (char c : flat) {
    if (c == '|') {
      stages.emplace_back();
    } else if (c == 'E' || c == 'L' || c == 't' || c == 'm') {
      stages.back() += c;
    } else {
      throw InputError(path, fmt::format("invalid layer character '{}' in the layout: Megatron "
                                         "knows E (embedding), t (transformer layer), m (MTP "
                                         "layer) and L (loss)",
                                         c));
    }
  }
  const auto n = static_cast<Count>(stages.size());
  if (n % pp != 0) {
    throw InputError(path, fmt::format("the layout has {} stages: Megatron needs a multiple of "
                                       "pipeline_model_parallel_size={}",
                                       n, pp));
  }
  // validate_layer_layout: embedding first, loss last, each once; the decoder and MTP counts.
  auto count_all = [&](char c) {
    Count k = 0;
    for (const std::string& st : stages) k += std::count(st.begin(), st.end(), c);
    return k;
  };
  if (stages.front().empty() || stages.front().front() != 'E' || count_all('E') != 1) {
    throw InputError(path, "the layout's first layer must be the embedding E, exactly once");
  }
  if (stages.back().empty() || stages.back().back() != 'L' || count_all('L') != 1) {
    throw InputError(path, "the layout's last layer must be the loss L, exactly once");
  }
  if (count_all('t') != num_layers) {
    throw InputError(path, fmt::format("the layout places {} decoder layers (t); the model has {}",
                                       count_all('t'), num_layers));
  }
  if (count_all('m') != mtp_layers) {
    throw InputError(path, fmt::format("the layout places {} MTP layers (m); the model has "
                                       "mtp_layers={}",
                                       count_all('m'), mtp_layers));
  }
  MegatronLayout out;
  out.mtp_layers = mtp_layers;
  out.decoder.resize(static_cast<std::size_t>(n));
  const Count v = n / pp;
  bool mtp_seen = false;
  for (Count i = 0; i < n; ++i) {
    const std::string& st = stages[static_cast<std::size_t>(i)];
    const Count t = std::count(st.begin(), st.end(), 't');
    const Count m = std::count(st.begin(), st.end(), 'm');
    out.decoder[static_cast<std::size_t>(i)] = t;
    if (m > 0) {
      // "decoder layers must be placed before MTP layers"; all MTP layers in one virtual stage,
      // the last chunk of its rank and not on the first rank.
      const std::size_t first_m = st.find('m');
      if (st.find('t', first_m) != std::string::npos || mtp_seen || m != mtp_layers ||
          i / pp != v - 1 || i % pp == 0) {
        throw InputError(path,
                         "Megatron places every MTP layer (m) in one virtual stage after all "
                         "decoder layers, in the last chunk of a rank other than the first");
      }
      mtp_seen = true;
      out.mtp_virtual_stage = i;
    } else if (mtp_seen && t > 0) {
      throw InputError(path, "decoder layers must be placed before MTP layers");
    }
  }
  return out;
}

namespace {

void fill_first(PipelineSplit& s) {
  s.first.resize(s.layers.size());
  Count at = 0;
  for (std::size_t i = 0; i < s.layers.size(); ++i) s.first[i] = at, at += s.layers[i];
}

// Megatron-LM get_num_layers_to_build (megatron/core/transformer/transformer_block.py) and
// TransformerConfig.__post_init__'s checks (transformer_config.py), NVIDIA/Megatron-LM d98e8a6:
// counts per (pp rank, vpp stage), returned in virtual stage order vpp·pp + rank.
std::vector<Count> megatron_split(const ModelSpec& m, const ParallelSpec& p,
                                  const PipelineSplitSpec& x) {
  const std::string base = "/parallel/pipeline_split";
  const Count pp = p.pp, v = p.virtual_stages, L = m.num_layers;
  const bool vpp = v > 1;
  std::vector<Count> per_rank(static_cast<std::size_t>(pp), 0);
  if (x.first_stage_layers || x.last_stage_layers) {
    if (x.account_for_embedding || x.account_for_loss) {
      throw InputError(base + "/account_for_embedding",
                       "Megatron-LM refuses first/last stage layer counts together with "
                       "account_for_embedding/account_for_loss (\"cannot be set at the same "
                       "time\")");
    }
    Count rest = L, middle = pp;
    for (auto [given, key] : {std::pair{x.first_stage_layers, "first_stage_layers"},
                              std::pair{x.last_stage_layers, "last_stage_layers"}}) {
      if (!given) continue;
      const std::string at = base + "/" + key;
      if (*given <= 0) throw InputError(at, "Megatron-LM needs a layer count larger than 0");
      if (vpp && *given % v != 0) {
        throw InputError(at, fmt::format("Megatron-LM needs the stage's {} layers divisible by "
                                         "the virtual pipeline degree {}",
                                         *given, v));
      }
      rest -= *given, --middle;
    }
    if (x.first_stage_layers && x.last_stage_layers && pp < 2) {
      throw InputError(base, "first and last stage layer counts together need pp >= 2");
    }
    if ((rest != 0) != (middle != 0) || rest < 0) {
      throw InputError(base, fmt::format("Megatron-LM: \"Mismatch: {} middle layers remaining "
                                         "but {} middle PP stages available\"",
                                         rest, middle));
    }
    if (middle > 0 && rest % middle != 0) {
      throw InputError(base, fmt::format("Megatron-LM needs the {} middle layers divisible by "
                                         "the {} middle pipeline stages",
                                         rest, middle));
    }
    const Count mid = middle > 0 ? rest / middle : 0;
    if (middle > 0 && vpp && mid % v != 0) {
      throw InputError(base, fmt::format("Megatron-LM needs the {} layers of each middle stage "
                                         "divisible by the virtual pipeline degree {}",
                                         mid, v));
    }
    std::fill(per_rank.begin(), per_rank.end(), mid);
    if (x.first_stage_layers) per_rank.front() = *x.first_stage_layers;
    if (x.last_stage_layers) per_rank.back() = *x.last_stage_layers;
  } else {
    const Count n = L + (x.account_for_embedding ? 1 : 0) + (x.account_for_loss ? 1 : 0);
    if (n % pp != 0) {
      throw InputError(base, fmt::format("Megatron-LM needs num_layers{} = {} divisible by "
                                         "pipeline_model_parallel_size={}",
                                         x.account_for_embedding || x.account_for_loss
                                             ? " plus the embedding and loss counted as layers"
                                             : "",
                                         n, pp));
    }
    if (vpp && (n / pp) % v != 0) {
      throw InputError(base, fmt::format("Megatron-LM needs the {} layers per pipeline rank "
                                         "divisible by virtual_pipeline_model_parallel_size={}",
                                         n / pp, v));
    }
    std::fill(per_rank.begin(), per_rank.end(), n / pp);
  }
  std::vector<Count> out(static_cast<std::size_t>(pp * v));
  for (Count c = 0; c < v; ++c)
    for (Count r = 0; r < pp; ++r)
      out[static_cast<std::size_t>(c * pp + r)] = per_rank[static_cast<std::size_t>(r)] / v;
  // The embedding (loss) counted as a layer of the first (last) virtual stage: one transformer
  // layer fewer there.
  if (x.account_for_embedding) {
    if (--out.front() < 0)
      throw InputError(base,
                       "Megatron-LM: \"Not enough layers in the first virtual pipeline "
                       "stage\"");
  }
  if (x.account_for_loss) {
    if (--out.back() < 0)
      throw InputError(base,
                       "Megatron-LM: \"Not enough layers in the last virtual pipeline "
                       "stage\"");
  }
  return out;
}

}  // namespace

PipelineSplit pipeline_split(const Scenario& s) {
  const ParallelSpec& p = s.parallel;
  const ModelSpec& m = s.model;
  PipelineSplit out;
  out.pp = p.pp;
  out.chunks = p.virtual_stages;
  out.v_shape = v_shape(p.schedule);
  out.bidirectional = bidirectional(p.schedule);
  const Count path = out.bidirectional ? p.pp : p.pp * p.virtual_stages;
  const PipelineSplitSpec& x = p.split;
  const std::string at = "/parallel/pipeline_split";
  auto refuse_two_chunk_placement = [&](std::string_view framework) {
    if (two_chunks(p.schedule)) {
      throw InputError(at + "/rule",
                       fmt::format("{}'s split rule is for its interleaved placement; schedule "
                                   "{} places chunks {} (give layers_per_virtual_stage)",
                                   framework, to_string(p.schedule),
                                   out.bidirectional ? "as DualPipe's two directions" : "in a V"));
    }
  };
  if (!p.layers_per_stage.empty()) {
    // One count per GPU stage, each stage's layers split evenly over its chunks.
    const std::string lp = "/parallel/layers_per_stage";
    if (static_cast<Count>(p.layers_per_stage.size()) != p.pp) {
      throw InputError(lp, fmt::format("has {} entries; pp={} needs one per stage",
                                       p.layers_per_stage.size(), p.pp));
    }
    if (x.rule != SplitRule::even) {
      throw InputError(lp, "give either layers_per_stage or pipeline_split, not both");
    }
    if (out.bidirectional) {
      throw InputError(lp,
                       "dualpipe holds two model stages per GPU stage (s and pp-1-s): give "
                       "each model stage's layers as layers_per_virtual_stage");
    }
    out.layers.assign(static_cast<std::size_t>(path), 0);
    for (Count st = 0; st < p.pp; ++st) {
      const Count n = p.layers_per_stage[static_cast<std::size_t>(st)];
      if (n % p.virtual_stages != 0) {
        throw InputError(fmt::format("{}/{}", lp, st),
                         fmt::format("{} layers do not split evenly into the stage's {} chunks; "
                                     "give each chunk's layers as layers_per_virtual_stage",
                                     n, p.virtual_stages));
      }
      for (Count c = 0; c < p.virtual_stages; ++c)
        out.layers[static_cast<std::size_t>(out.virtual_stage(st, c))] = n / p.virtual_stages;
    }
  } else {
    switch (x.rule) {
      case SplitRule::even:
        if (m.num_layers < path) {
          throw InputError("/parallel/virtual_stages",
                           fmt::format("{} layers cannot fill the pipeline's {} virtual stages "
                                       "evenly; give the split (layers_per_virtual_stage, or a "
                                       "framework's rule in pipeline_split)",
                                       m.num_layers, path));
        }
        out.layers = even_split(m.num_layers, path);
        break;
      case SplitRule::explicit_layers:
        if (static_cast<Count>(x.layers.size()) != path) {
          throw InputError("/parallel/layers_per_virtual_stage",
                           fmt::format("has {} entries; the pipeline has {} virtual stages ({})",
                                       x.layers.size(), path,
                                       out.bidirectional ? "dualpipe: the pp model stages"
                                                         : "pp * virtual_stages, in path order"));
        }
        out.layers = x.layers;
        break;
      case SplitRule::megatron:
        refuse_two_chunk_placement("Megatron-LM");
        out.layers = megatron_split(m, p, x);
        break;
      case SplitRule::megatron_layout: {
        refuse_two_chunk_placement("Megatron-LM");
        const MegatronLayout l =
            parse_megatron_layout(x.layout, p.pp, m.num_layers, m.mtp_layers, at + "/layout");
        if (static_cast<Count>(l.decoder.size()) != path) {
          throw InputError(
              at + "/layout",
              fmt::format("the layout has {} stages, {} per pipeline rank; the "
                          "scenario has virtual_stages={} (Megatron: "
                          "\"virtual_pipeline_model_parallel_size conflicts with "
                          "pipeline_model_parallel_layout\")",
                          l.decoder.size(), static_cast<Count>(l.decoder.size()) / p.pp,
                          p.virtual_stages));
        }
        out.layers = l.decoder;
        out.mtp_virtual_stage = l.mtp_virtual_stage;
        break;
      }
      case SplitRule::torchtitan:
        if (out.bidirectional) {
          throw InputError(at + "/rule",
                           "torchtitan does not run DualPipe's bidirectional "
                           "placement (give layers_per_virtual_stage)");
        }
        out.layers = torchtitan_split(m.num_layers, path, x.first_stage_less_layers,
                                      x.last_stage_less_layers, at);
        break;
    }
  }
  const Count sum = std::accumulate(out.layers.begin(), out.layers.end(), Count{0});
  if (sum != m.num_layers) {
    throw InputError(p.layers_per_stage.empty() ? "/parallel/layers_per_virtual_stage"
                                                : "/parallel/layers_per_stage",
                     fmt::format("sums to {} layers; the model has {}", sum, m.num_layers));
  }
  fill_first(out);
  return out;
}

namespace {

// One virtual stage's symbols, e.g. "Et*3" or "tt".
std::string layout_stage(const PipelineSplit& split, Count vs, Count mtp_stage, Count mtp_layers) {
  std::string out;
  if (vs == 0) out += 'E';
  const Count t = split.layers[static_cast<std::size_t>(vs)];
  if (t > 2) {
    out += fmt::format("t*{}", t);
  } else {
    out.append(static_cast<std::size_t>(t), 't');
  }
  if (vs == mtp_stage) out += mtp_layers > 1 ? fmt::format("m*{}", mtp_layers) : "m";
  if (vs == split.path() - 1) out += 'L';
  return out;
}

}  // namespace

std::string megatron_layout_string(const PipelineSplit& split, Count mtp_layers) {
  const Count n = split.path();
  const Count mtp_stage =
      mtp_layers == 0 ? -1 : (split.mtp_virtual_stage >= 0 ? split.mtp_virtual_stage : n - 1);
  std::vector<std::string> stages;
  for (Count i = 0; i < n; ++i) stages.push_back(layout_stage(split, i, mtp_stage, mtp_layers));
  // Fold runs of equal stages: "(tt|)*29" as Megatron's documentation writes them.
  std::string out;
  for (std::size_t i = 0; i < stages.size();) {
    std::size_t j = i;
    while (j < stages.size() && stages[j] == stages[i]) ++j;
    const std::size_t run = j - i;
    const bool last = j == stages.size();
    if (run > 2 && !last) {
      // The group ends with its separator; a cosmetic comma before what follows.
      out += fmt::format("({}|)*{},", stages[i], run);
    } else {
      for (std::size_t k = i; k < j; ++k) out += stages[k] + (k + 1 < stages.size() ? "|" : "");
    }
    i = j;
  }
  return out;
}

}  // namespace distplan
