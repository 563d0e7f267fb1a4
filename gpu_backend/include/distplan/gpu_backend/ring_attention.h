// Ring attention kernels for context parallelism (cp_comm = p2p), as Transformer Engine runs it
// for Megatron-Core (transformer_engine/pytorch/attention/dot_product_attention/
// context_parallel.py, AttnFuncWithCPAndKVP2P; docs/gpu_backend.md, "Context parallelism").
//
// The sequence is cut into 2·cp chunks; CP rank r holds chunks r and 2cp-1-r (causal load
// balancing, Megatron-Core get_batch_on_this_cp_rank), so its local sequence of sl = s/cp rows is
// [chunk r | chunk 2cp-1-r]. Keys and values travel around the ring; each step attends this
// rank's queries to one rank's KV block, and the partial outputs merge by their log-sum-exp
// (flash attention's rescaling, Dao et al. 2022, sec. 3.1). Layouts as cpu_ops.h: q, out
// (s,b,a,d), k, v (s,b,g,d), lse (b,a,s), softmax scale 1/sqrt(d), sequence-major tokens.
//
// CPU functions, instantiated for float (training) and double (finite-difference checks).
#pragma once

#include "distplan/planner/units.h"

namespace distplan::backend::ring {

/// Global sequence position of row i of CP rank r's local sequence (sl = s/cp rows, the two
/// chunks r and 2cp-1-r of length sl/2 each).
[[nodiscard]] Count global_position(Count i, Count sl, Count cp, Count r) noexcept;

/// A range of sequence rows.
struct Rows {
  Count begin = 0, count = 0;
};

/// Rows of one step of the ring: this rank's query rows against the KV block's rows, with the
/// causal mask (key row j visible to query row i when j <= offset + i, rows counted from each
/// range's start: offset 0 is the diagonal block, offset > 0 a block whose first `offset` keys
/// precede the first query) or none.
struct Step {
  Rows q, kv;
  bool causal = false;
  Count offset = 0;
};

/// The step of CP rank r on the KV block of rank j (Transformer Engine's three cases): j == r,
/// the local block under the causal mask; j < r, every query row against the block's first chunk
/// (chunk j precedes both of r's chunks; its chunk 2cp-1-j follows them); j > r, the second
/// chunk's query rows (chunk 2cp-1-r) against the whole block (both of j's chunks precede it),
/// and no row of the first chunk sees the block.
[[nodiscard]] Step step_for_block(Count j, Count r, Count sl) noexcept;

/// Attention of query rows st.q of q (s rows) against key rows st.kv of k and v (any number of
/// rows): writes out and lse at the query rows only. Every query row must see at least one key.
template <class T>
void block_forward(const T* q, const T* k, const T* v, T* out, T* lse, Count s, const Step& st,
                   Count b, Count a, Count g, Count d);

/// The KV all-gather's two steps for CP rank r (Transformer Engine AttnFuncWithCPAndKVAllGather;
/// Llama 3, Grattafiori et al. 2024, sec. 3.3.2): local chunk 0 (global chunk r) and chunk 1
/// (global chunk 2cp-1-r) each against the gathered keys in global order up to its own end, the
/// last chunk of them under the causal mask.
[[nodiscard]] Step all_gather_step(int chunk, Count r, Count cp, Count sl) noexcept;

/// Merges one step's (out_step, lse_step) at `rows` into the running (out, lse):
/// lse' = log(e^lse + e^lse_step), out' = out·e^(lse - lse') + out_step·e^(lse_step - lse')
/// (Transformer Engine flash_attn_fwd_softmax_lse_correction / flash_attn_fwd_out_correction).
/// A running lse of -inf (no step yet) takes the step as it is.
template <class T>
void merge(T* out, T* lse, const T* out_step, const T* lse_step, Count s, Rows rows, Count b,
           Count a, Count d);

/// Backward of one step from the merged output and log-sum-exp (flash attention's backward:
/// P = exp(scale q k - lse), D = rowsum(dout * out)): *accumulates* dq at st.q rows and dk, dv at
/// st.kv rows.
template <class T>
void block_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse,
                    T* dq, T* dk, T* dv, Count s, const Step& st, Count b, Count a, Count g,
                    Count d);

}  // namespace distplan::backend::ring
