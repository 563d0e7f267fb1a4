// Conversion between Python objects and nlohmann::json, element by element through the C API (no
// JSON text in between): dict <-> object, list/tuple <-> array, str, int, float, bool, None.
#pragma once

#include <Python.h>

#include <string>

#include <nlohmann/json.hpp>

namespace distplan::py {

/// Reads a Python value as JSON. What JSON cannot hold (a non-string key, a set, an int beyond
/// 64 bits, a NaN) throws InputError naming the JSON pointer `path` + the offending element.
/// Needs the GIL.
[[nodiscard]] nlohmann::json from_python(PyObject* o, const std::string& path = "");

/// A new reference to the Python value of `j`, as json.loads would build it from the CLI's text of
/// the same document (NaN and infinities become None, as nlohmann::json writes them as null).
/// Needs the GIL; returns nullptr with a Python error set when out of memory.
[[nodiscard]] PyObject* to_python(const nlohmann::json& j);

}  // namespace distplan::py
