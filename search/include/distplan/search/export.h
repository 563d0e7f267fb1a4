// A layout as launch settings for the frameworks people train with: Megatron-LM command-line
// arguments, a DeepSpeed config JSON, a torchtitan (FSDP2) TOML config. An export writes exactly
// the planned layout in the framework's terms or refuses (InputError at the field the framework
// cannot express): the plan must be made under that framework (training.framework), whose
// capabilities (planner/capabilities.h) validation already applied. Every mapping is documented
// in docs/exports.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "distplan/planner/spec.h"

namespace distplan::search {

/// peft: fine-tuning (training.peft) with Hugging Face PEFT, bitsandbytes and Accelerate.
enum class ExportFormat { megatron, deepspeed, torchtitan, peft };
[[nodiscard]] std::string_view to_string(ExportFormat f) noexcept;
/// The framework whose launch settings a format writes.
[[nodiscard]] Framework framework_of(ExportFormat f) noexcept;

/// The framework versions whose argument names and config keys the exports use
/// (docs/exports.md names the source files and commits).
inline constexpr std::string_view kMegatronVersion = "Megatron-LM core_v0.15.3";
inline constexpr std::string_view kTorchtitanVersion = "torchtitan v0.2.2";
inline constexpr std::string_view kPeftVersion = "PEFT v0.20.0";
inline constexpr std::string_view kBitsandbytesVersion = "bitsandbytes 0.49.2";
inline constexpr std::string_view kAccelerateVersion =
    "Accelerate (fsdp_config / deepspeed_config keys of PEFT v0.20.0's examples/sft/configs)";
inline constexpr std::string_view kDeepSpeedVersion = "DeepSpeed v0.18.0";

struct Exported {
  std::string text;                 // the arguments, JSON or TOML
  std::vector<std::string> notes;   // how the framework reads a value (never a substitution)
  std::vector<std::string> to_add;  // what the user still has to supply (tokenizer, data, LR, ...)
  bool fits = true;                 // the planner's peak fits the GPU
  Bytes peak_bytes = 0;             // the planner's peak per GPU
  Bytes capacity_bytes = 0;         // the GPU's memory
};

/// The scenario's layout (tp, cp, pp, dp, ep, ZeRO, recompute, sp, schedule, split, batch,
/// precision, offload, the overlaps it assumes) and model shape in the framework's own terms.
/// The scenario must be valid (validate_scenario()) and planned under framework_of(format);
/// anything else throws InputError naming the field.
[[nodiscard]] Exported export_scenario(const Scenario& s, ExportFormat format);

/// "the layout does not fit: the planner's peak is 81.20 GiB per GPU, the GPU has 80.00 GiB", or
/// empty when the export's layout fits.
[[nodiscard]] std::string fit_warning(const Exported& e);

/// export_scenario as a person asks for it (the CLI's `export`, Python's distplan.export): a
/// layout that does not fit is refused, InputError at /parallel naming its peak and the capacity,
/// unless `force` (then `fit_warning` says why it was exported anyway). docs/exports.md.
[[nodiscard]] Exported export_checked(const Scenario& s, ExportFormat format, bool force);

/// The fine-tuning export (export_peft.cpp): `seed` carries the fit, as export_scenario() sets it.
[[nodiscard]] Exported export_peft(const Scenario& s, Exported seed);

/// Megatron-LM's Mixture-of-Experts arguments (experts, router, layer pattern, expert layout,
/// auxiliary loss, grouped GEMM), appended to `args`; what Megatron-LM cannot express goes to
/// `notes`. Nothing for a dense model.
void megatron_moe_args(const Scenario& s, std::vector<std::string>& args,
                       std::vector<std::string>& notes);

namespace detail {
/// The torchtitan TOML of `s` (export_torchtitan.cpp).
Exported torchtitan_export(const Scenario& s, Exported out);
/// One line of the export's header when the layout does not fit; empty when it does.
std::string warning_comment(const Exported& e);
/// The "# you still add:" lines.
std::string to_add_lines(const Exported& e);
}  // namespace detail

}  // namespace distplan::search
