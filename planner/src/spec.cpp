#include "distplan/planner/spec.h"

#include "distplan/planner/estimate.h"

namespace distplan {

std::string_view to_string(Mlp v) noexcept {
  return v == Mlp::gelu ? "gelu" : v == Mlp::swiglu ? "swiglu" : "geglu";
}
std::string_view to_string(Norm v) noexcept {
  return v == Norm::layernorm ? "layernorm" : "rmsnorm";
}
std::string_view to_string(PositionEmbedding v) noexcept {
  switch (v) {
    case PositionEmbedding::learned:
      return "learned";
    case PositionEmbedding::rotary:
      return "rotary";
    case PositionEmbedding::alibi:
      return "alibi";
  }
  return "?";
}
std::string_view to_string(DType v) noexcept {
  switch (v) {
    case DType::fp32:
      return "fp32";
    case DType::fp16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}
std::string_view to_string(Optimizer v) noexcept {
  switch (v) {
    case Optimizer::adamw:
      return "adamw";
    case Optimizer::adam:
      return "adam";
    case Optimizer::sgd:
      return "sgd";
  }
  return "?";
}
std::string_view to_string(Attention v) noexcept {
  return v == Attention::flash ? "flash" : "standard";
}
std::string_view to_string(Recompute v) noexcept {
  switch (v) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
    case Recompute::selective_op:
      return "selective_op";
  }
  return "?";
}
std::string_view to_string(Offload v) noexcept {
  switch (v) {
    case Offload::none:
      return "none";
    case Offload::cpu:
      return "cpu";
    case Offload::nvme:
      return "nvme";
  }
  return "?";
}
std::string_view to_string(CpComm v) noexcept {
  switch (v) {
    case CpComm::p2p:
      return "p2p";
    case CpComm::all_gather:
      return "all_gather";
    case CpComm::a2a:
      return "a2a";
  }
  return "?";
}
std::string_view to_string(Fp8Recipe v) noexcept {
  switch (v) {
    case Fp8Recipe::none:
      return "none";
    case Fp8Recipe::delayed:
      return "delayed";
    case Fp8Recipe::current:
      return "current";
    case Fp8Recipe::blockwise:
      return "blockwise";
    case Fp8Recipe::mxfp8:
      return "mxfp8";
  }
  return "?";
}
std::string_view to_string(SplitRule v) noexcept {
  switch (v) {
    case SplitRule::even:
      return "even";
    case SplitRule::explicit_layers:
      return "explicit";
    case SplitRule::megatron:
      return "megatron";
    case SplitRule::megatron_layout:
      return "megatron_layout";
    case SplitRule::torchtitan:
      return "torchtitan";
  }
  return "?";
}
std::string_view to_string(Kernels v) noexcept {
  switch (v) {
    case Kernels::fused:
      return "fused";
    case Kernels::compiled:
      return "compiled";
    case Kernels::eager:
      return "eager";
  }
  return "?";
}
std::string_view to_string(Schedule v) noexcept {
  switch (v) {
    case Schedule::gpipe:
      return "gpipe";
    case Schedule::one_f_one_b:
      return "1f1b";
    case Schedule::interleaved_1f1b:
      return "interleaved_1f1b";
    case Schedule::zb_h1:
      return "zb_h1";
    case Schedule::zb_h2:
      return "zb_h2";
    case Schedule::zb_v:
      return "zb_v";
    case Schedule::v_half:
      return "v_half";
    case Schedule::v_min:
      return "v_min";
    case Schedule::dualpipe_v:
      return "dualpipe_v";
    case Schedule::dualpipe:
      return "dualpipe";
    case Schedule::zb_auto:
      return "zb_auto";
  }
  return "?";
}
std::string_view to_string(Router v) noexcept {
  return v == Router::softmax ? "softmax" : "sigmoid";
}
std::string_view to_string(Group v) noexcept {
  switch (v) {
    case Group::dp:
      return "dp";
    case Group::dp_replicate:
      return "dp_replicate";
    case Group::tp:
      return "tp";
    case Group::pp:
      return "pp";
    case Group::embedding:
      return "embedding";
    case Group::cp:
      return "cp";
    case Group::ep:
      return "ep";
    case Group::edp:
      return "edp";
    case Group::etp:
      return "etp";
  }
  return "?";
}
std::string_view to_string(CollectiveOp v) noexcept {
  switch (v) {
    case CollectiveOp::all_reduce:
      return "all_reduce";
    case CollectiveOp::reduce_scatter:
      return "reduce_scatter";
    case CollectiveOp::all_gather:
      return "all_gather";
    case CollectiveOp::send_recv:
      return "send_recv";
    case CollectiveOp::all_to_all:
      return "all_to_all";
  }
  return "?";
}
std::string_view to_string(Link v) noexcept {
  return v == Link::intra_node ? "intra_node" : "inter_node";
}
std::string_view to_string(TimeEngine v) noexcept {
  return v == TimeEngine::lower_bound ? "lower_bound" : "schedule_walk";
}

}  // namespace distplan
