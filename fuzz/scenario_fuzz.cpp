// libFuzzer target: arbitrary bytes through parse_json_text and the whole scenario path of
// `distplan plan` (and of `distplan simulate` when the simulator is built); pipeline.h says what a
// finding is. docs/trust.md describes how to run it and what it has found.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "pipeline.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json doc;
  try {
    doc = distplan::parse_json_text(text);
  } catch (const distplan::InputError&) {
    return 0;
  }
  distplan::fuzz::run_pipeline(doc);
  return 0;
}
