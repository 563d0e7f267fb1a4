// Errors at the input edge: every one names the JSON path of the offending field.
#pragma once

#include <stdexcept>
#include <string>

namespace distplan {

/// Invalid input. `path` is a JSON pointer ("/parallel/tp"); empty for the document itself.
/// The CLI prints it as {"error": {"code": "invalid_input", "path": ..., "message": ...}}, exit 2.
class InputError : public std::runtime_error {
 public:
  InputError(std::string path, const std::string& message)
      : std::runtime_error(message), path_(std::move(path)) {}
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace distplan
