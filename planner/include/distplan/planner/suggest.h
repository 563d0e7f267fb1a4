// "Did you mean": the known name closest to a misspelt one, for error messages.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace distplan {

/// The candidate `name` most likely meant, or nothing when none is close. Names compare without
/// case and without the separators '-', '_', '.' and ' ' (so `llama-3.1-8b` finds `llama3.1-8b`);
/// close means an edit distance of at most max(2, length/3) on that form, or one being a prefix
/// of the other (at least 4 characters: `global_batch` finds `global_batch_size`).
[[nodiscard]] std::optional<std::string> closest_name(std::string_view name,
                                                      const std::vector<std::string>& candidates);

/// " (did you mean 'x'?)" or "".
[[nodiscard]] std::string did_you_mean(std::string_view name,
                                       const std::vector<std::string>& candidates);

/// Equal without regard to ASCII case.
[[nodiscard]] bool iequals(std::string_view a, std::string_view b) noexcept;

}  // namespace distplan
