// Bounded reading of input files (scenarios, Hugging Face configs, validation results). One size
// limit for every reader, so a huge file or an endless device (/dev/zero) fails fast with an
// InputError instead of exhausting memory (docs/trust.md).
#pragma once

#include <cstddef>
#include <istream>
#include <string>

namespace distplan {

/// The largest input accepted: a scenario is a few kilobytes.
inline constexpr std::size_t kMaxInputBytes = std::size_t{16} << 20;

/// Reads at most kMaxInputBytes from `in`; longer input throws InputError naming `what`.
[[nodiscard]] std::string read_bounded(std::istream& in, const std::string& what);

/// Reads the file at `path` ("-": standard input) with the same bound. A directory, a missing
/// file or a longer input throws InputError (path "") naming `what` and `path`.
[[nodiscard]] std::string read_input_file(const std::string& path, const std::string& what);

}  // namespace distplan
