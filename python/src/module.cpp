// distplan._distplan: the planner, simulator and search behind `import distplan` (docs/python.md).
// Every function reads the same JSON documents as the CLI and answers with the CLI's own
// serialisers (plan_to_json, simulate_to_json, result_to_json, presets_to_json), converted to
// Python objects element by element. Computation runs with the GIL released.
#include <Python.h>

#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/simulate.h"
#include "distplan/simulator/simulate_json.h"
#include "py_json.h"

namespace pyb = pybind11;
using nlohmann::json;

namespace distplan::py {
namespace {

pyb::object to_object(const json& j) {
  PyObject* o = to_python(j);
  if (o == nullptr) throw pyb::error_already_set();
  return pyb::reinterpret_steal<pyb::object>(o);
}

// distplan.InputError(message, path, code) lives in distplan/_errors.py; raised with the CLI's
// code.
void raise_input_error(const InputError& e) {
  static pyb::object cls = pyb::module_::import("distplan._errors").attr("InputError");
  pyb::object exc = cls(pyb::str(e.what()), pyb::str(e.path()), pyb::str("invalid_input"));
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

pyb::object plan(pyb::handle scenario) {
  const json doc = from_python(scenario.ptr());
  json out;
  {
    pyb::gil_scoped_release nogil;
    const Scenario s = scenario_from_json(doc);
    out = plan_to_json(s, estimate(s));
  }
  return to_object(out);
}

// Plans a list of scenarios in blocks: each block's inputs are read with the GIL held, planned
// without it, and its answers converted with it again, so memory stays bounded for long sweeps.
pyb::list plan_many(pyb::handle scenarios) {
  PyObject* seq = PySequence_Fast(scenarios.ptr(), "plan_many takes a list of scenarios");
  if (seq == nullptr) throw pyb::error_already_set();
  const auto holder = pyb::reinterpret_steal<pyb::object>(seq);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  pyb::list result(n);
  constexpr Py_ssize_t kBlock = 256;
  std::vector<json> docs;
  std::vector<json> outs;
  for (Py_ssize_t begin = 0; begin < n; begin += kBlock) {
    const Py_ssize_t end = std::min(n, begin + kBlock);
    docs.clear();
    for (Py_ssize_t i = begin; i < end; ++i) {
      docs.push_back(from_python(PySequence_Fast_GET_ITEM(seq, i), "/" + std::to_string(i)));
    }
    outs.assign(docs.size(), json());
    {
      pyb::gil_scoped_release nogil;
      for (std::size_t k = 0; k < docs.size(); ++k) {
        try {
          const Scenario s = scenario_from_json(docs[k]);
          outs[k] = plan_to_json(s, estimate(s));
        } catch (const InputError& e) {
          // The list is the document: the error's pointer starts at the scenario's index.
          throw InputError("/" + std::to_string(begin + static_cast<Py_ssize_t>(k)) + e.path(),
                           e.what());
        }
      }
    }
    for (std::size_t k = 0; k < outs.size(); ++k) {
      PyObject* o = to_python(outs[k]);
      if (o == nullptr) throw pyb::error_already_set();
      PyList_SET_ITEM(result.ptr(), begin + static_cast<Py_ssize_t>(k), o);  // steals o
    }
  }
  return result;
}

pyb::object simulate(pyb::handle scenario, pyb::handle costs) {
  const json doc = from_python(scenario.ptr());
  std::optional<json> costs_doc;
  if (!costs.is_none()) costs_doc = from_python(costs.ptr(), "/costs");
  json out;
  {
    pyb::gil_scoped_release nogil;
    const Scenario s = scenario_from_json(doc, {"costs"});
    sim::SimOptions so;
    if (doc.is_object() && doc.contains("costs")) {
      if (costs_doc) {
        throw InputError("/costs", "costs are given twice: in the scenario and as costs=");
      }
      so.costs = sim::cost_override_from_json(doc.at("costs"), "/costs");
    } else if (costs_doc) {
      so.costs = sim::cost_override_from_json(*costs_doc, "/costs");
    }
    const Estimate e = estimate(s);
    out = sim::simulate_to_json(s, sim::simulate(s, e, so));
  }
  return to_object(out);
}

pyb::object search_layouts(pyb::handle request) {
  const json doc = from_python(request.ptr());
  json out;
  {
    pyb::gil_scoped_release nogil;
    const search::Request req = search::request_from_json(doc);
    out = search::result_to_json(req, search::run(req.space, req.options));
  }
  return to_object(out);
}

pyb::object presets() {
  return to_object(presets_to_json());
}

pyb::object default_scenario_document() {
  return to_object(parse_json_text(default_scenario_text()));
}

}  // namespace
}  // namespace distplan::py

PYBIND11_MODULE(_distplan, m) {
  using namespace distplan::py;
  m.doc() = "distplan's C++ core: plan, plan_many, simulate, search, presets (docs/python.md)";
  m.attr("__version__") = DISTPLAN_VERSION;
  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const distplan::InputError& e) {
      raise_input_error(e);
    }
  });
  m.def("plan", &plan, pyb::arg("scenario"),
        "Memory per stage, communication, FLOPs and time of a layout (distplan.plan/v1).");
  m.def("plan_many", &plan_many, pyb::arg("scenarios"),
        "plan() of each scenario of a list, in order; an error's path starts with the index.");
  m.def("simulate", &simulate, pyb::arg("scenario"), pyb::arg("costs") = pyb::none(),
        "Discrete-event simulation of one training step (distplan.simulate/v1).");
  m.def("search", &search_layouts, pyb::arg("request"),
        "The best layouts of a model on a cluster (distplan.search/v1).");
  m.def("presets", &presets, "The model and GPU presets (distplan.presets/v1).");
  m.def("default_scenario", &default_scenario_document,
        "The embedded example scenario (Llama-2-70B on 64 x H100-SXM-80GB), as a dict.");
}
