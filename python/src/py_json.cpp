#include "py_json.h"

#include <cmath>
#include <string_view>
#include <unordered_map>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::py {
namespace {

// RFC 6901: '~' and '/' inside a key are escaped as "~0" and "~1".
std::string pointer_token(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string type_name(PyObject* o) {
  return Py_TYPE(o)->tp_name;
}

nlohmann::json from_python_at(PyObject* o, std::string& path);

nlohmann::json object_from_dict(PyObject* o, std::string& path) {
  nlohmann::json out = nlohmann::json::object();
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(o, &pos, &key, &value)) {
    if (!PyUnicode_Check(key)) {
      throw InputError(path, "object keys must be strings, not " + type_name(key));
    }
    Py_ssize_t n = 0;
    const char* k = PyUnicode_AsUTF8AndSize(key, &n);
    if (k == nullptr) {
      PyErr_Clear();
      throw InputError(path, "an object key is not valid Unicode");
    }
    const std::string_view name(k, static_cast<std::size_t>(n));
    const std::size_t mark = path.size();
    path += '/';
    path += pointer_token(name);
    out.emplace(std::string(name), from_python_at(value, path));
    path.resize(mark);
  }
  return out;
}

nlohmann::json array_from_sequence(PyObject* o, std::string& path) {
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  nlohmann::json out = nlohmann::json::array();
  auto& arr = out.get_ref<nlohmann::json::array_t&>();
  arr.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const std::size_t mark = path.size();
    path += '/';
    path += std::to_string(i);
    arr.push_back(from_python_at(items[i], path));
    path.resize(mark);
  }
  return out;
}

nlohmann::json integer(PyObject* o, const std::string& path) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow == 0) {
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw InputError(path, "cannot read the integer");
    }
    return nlohmann::json(static_cast<std::int64_t>(v));
  }
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (!PyErr_Occurred()) return nlohmann::json(static_cast<std::uint64_t>(u));
    PyErr_Clear();
  }
  throw InputError(path, "integer out of the 64-bit range");
}

// Containers open on the way down: a document deeper than any distplan reads (kMaxJsonDepth, as
// the JSON text reader) is refused at the container that holds the first too-deep one, which
// also stops a dict or list that contains itself (it recursed until the interpreter crashed).
thread_local int depth = 0;
struct Nested {
  explicit Nested(const std::string& path) {
    if (depth >= kMaxJsonDepth) {
      throw InputError(path, "nested deeper than " + std::to_string(kMaxJsonDepth) +
                                 " levels here (a scenario has about 5; a dict or list that "
                                 "contains itself?)");
    }
    ++depth;
  }
  ~Nested() { --depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
};

nlohmann::json from_python_at(PyObject* o, std::string& path) {
  if (PyDict_Check(o)) {
    const Nested level(path);
    return object_from_dict(o, path);
  }
  // bool before int: True is an int in Python.
  if (PyBool_Check(o)) return nlohmann::json(o == Py_True);
  if (PyLong_Check(o)) return integer(o, path);
  if (PyFloat_Check(o)) {
    const double v = PyFloat_AS_DOUBLE(o);
    if (!std::isfinite(v)) throw InputError(path, "JSON has no NaN or infinity");
    return nlohmann::json(v);
  }
  if (PyUnicode_Check(o)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == nullptr) {
      PyErr_Clear();
      throw InputError(path, "string is not valid Unicode");
    }
    return nlohmann::json(std::string(s, static_cast<std::size_t>(n)));
  }
  if (o == Py_None) return nlohmann::json(nullptr);
  if (PyList_Check(o) || PyTuple_Check(o)) {
    const Nested level(path);
    return array_from_sequence(o, path);
  }
  throw InputError(
      path, "a " + type_name(o) + " is not JSON (use dict, list, str, int, float, bool or None)");
}

// Object keys repeat across documents (every plan has the same few hundred), so their Python
// strings are made once and kept: a plan's dict then costs no key allocations and no key hashing
// (a str caches its hash). Guarded by the GIL; bounded, and long keys are never kept.
PyObject* key_object(const std::string& k) {
  static std::unordered_map<std::string, PyObject*> cache;
  constexpr std::size_t kMaxKeys = 4096;
  constexpr std::size_t kMaxKeyLength = 64;
  if (auto it = cache.find(k); it != cache.end()) {
    Py_INCREF(it->second);
    return it->second;
  }
  PyObject* s = PyUnicode_DecodeUTF8(k.data(), static_cast<Py_ssize_t>(k.size()), "replace");
  if (s != nullptr && k.size() <= kMaxKeyLength && cache.size() < kMaxKeys) {
    PyUnicode_InternInPlace(&s);
    Py_INCREF(s);  // the cache's reference
    cache.emplace(k, s);
  }
  return s;
}

}  // namespace

nlohmann::json from_python(PyObject* o, const std::string& path) {
  std::string p = path;
  return from_python_at(o, p);
}

PyObject* to_python(const nlohmann::json& j) {
  using V = nlohmann::json::value_t;
  switch (j.type()) {
    case V::object: {
      const auto& obj = j.get_ref<const nlohmann::json::object_t&>();
#if !defined(Py_LIMITED_API) && PY_VERSION_HEX < 0x030D0000
      // Sized once: a plan's objects have up to 14 members, which would otherwise grow the table
      // twice. (Private in CPython up to 3.12, removed in 3.13.)
      PyObject* d = _PyDict_NewPresized(static_cast<Py_ssize_t>(obj.size()));
#else
      PyObject* d = PyDict_New();
#endif
      if (d == nullptr) return nullptr;
      for (const auto& [k, v] : obj) {
        PyObject* key = key_object(k);
        PyObject* value = key != nullptr ? to_python(v) : nullptr;
        const int rc = value != nullptr ? PyDict_SetItem(d, key, value) : -1;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (rc != 0) {
          Py_DECREF(d);
          return nullptr;
        }
      }
      return d;
    }
    case V::array: {
      const auto& arr = j.get_ref<const nlohmann::json::array_t&>();
      PyObject* l = PyList_New(static_cast<Py_ssize_t>(arr.size()));
      if (l == nullptr) return nullptr;
      for (std::size_t i = 0; i < arr.size(); ++i) {
        PyObject* v = to_python(arr[i]);
        if (v == nullptr) {
          Py_DECREF(l);
          return nullptr;
        }
        PyList_SET_ITEM(l, static_cast<Py_ssize_t>(i), v);  // steals v
      }
      return l;
    }
    case V::string: {
      const auto& s = j.get_ref<const std::string&>();
      return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
    }
    case V::boolean:
      return PyBool_FromLong(j.get<bool>() ? 1 : 0);
    case V::number_integer:
      return PyLong_FromLongLong(j.get<std::int64_t>());
    case V::number_unsigned:
      return PyLong_FromUnsignedLongLong(j.get<std::uint64_t>());
    case V::number_float: {
      const double v = j.get<double>();
      if (!std::isfinite(v)) Py_RETURN_NONE;
      return PyFloat_FromDouble(v);
    }
    case V::null:
    case V::discarded:
    case V::binary:
      break;
  }
  Py_RETURN_NONE;
}

}  // namespace distplan::py
