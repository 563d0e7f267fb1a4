#include "distplan/planner/input_file.h"

#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "distplan/planner/error.h"

namespace distplan {

namespace {

[[noreturn]] void input_too_large(const std::string& what) {
  throw InputError("", fmt::format("{} is larger than {} MiB; a scenario is a few kB", what,
                                   kMaxInputBytes >> 20));
}

}  // namespace

std::string read_bounded(std::istream& in, const std::string& what) {
  std::string text;
  char buf[1 << 16];
  // One byte past the bound tells that the input is longer.
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxInputBytes) input_too_large(what);
  }
  return text;
}

std::string read_input_file(const std::string& path, const std::string& what) {
  if (path == "-") return read_bounded(std::cin, what + " (stdin)");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError("", what + " '" + path + "' is a directory");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxInputBytes) input_too_large(what + " '" + path + "'");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError("", "cannot open " + what + " '" + path + "'");
  return read_bounded(f, what + " '" + path + "'");
}

}  // namespace distplan
