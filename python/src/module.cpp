// distplan._distplan: the planner, simulator and search behind `import distplan` (docs/python.md).
// Every function reads the same JSON documents as the CLI and answers with the CLI's own
// serialisers (plan_to_json, simulate_to_json, result_to_json, presets_to_json), converted to
// Python objects element by element. Computation runs with the GIL released.
#include <Python.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "distplan/planner/calibrate.h"
#include "distplan/planner/calibrate_json.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/interval.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/export.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"
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

// distplan.InputError(message, path, code) lives in distplan/_errors.py, with the CLI's code.
pyb::object input_error_class() {
  static pyb::object cls = pyb::module_::import("distplan._errors").attr("InputError");
  return cls;
}

pyb::object input_error_object(const InputError& e) {
  return input_error_class()(pyb::str(e.what()), pyb::str(e.path()), pyb::str("invalid_input"));
}

void raise_input_error(const InputError& e) {
  PyErr_SetObject(input_error_class().ptr(), input_error_object(e).ptr());
}

// distplan plan's document: plan_to_json and, with the time, the prediction interval from the
// corpus residuals of the walk (docs/fidelity.md, "Prediction intervals"), as the CLI writes it.
json plan_document(const Scenario& s, const Estimate& e, unsigned parts = plan_all) {
  json j = plan_to_json(s, e, parts);
  if (parts & plan_time) {
    j["time"]["tokens_per_second_interval"] = interval_to_json(throughput_interval(
        s, e.time.tokens_per_second, [](const Scenario& x) { return sim::plan(x); }));
  }
  return j;
}

pyb::object plan(pyb::handle scenario) {
  const json doc = from_python(scenario.ptr());
  json out;
  {
    pyb::gil_scoped_release nogil;
    const Scenario s = scenario_from_json(doc);
    out = plan_document(s, sim::plan(s));
  }
  return to_object(out);
}

// Pauses Python's cyclic garbage collector while a call builds many containers that cannot form
// cycles: otherwise every 700 new dicts and lists trigger a collection that walks the young ones
// (a third of plan_many's time for memory sections). Collections resume afterwards.
class GcPause {
 public:
#if PY_VERSION_HEX >= 0x030A0000
  GcPause() : was_enabled_(PyGC_Disable() != 0) {}
  ~GcPause() {
    if (was_enabled_) PyGC_Enable();
  }

 private:
  bool was_enabled_;
#endif
};

// The PlanPart bits of `parts`: None for the whole document, else an iterable of top-level names.
unsigned plan_parts(pyb::handle parts) {
  if (parts.is_none()) return plan_all;
  if (PyUnicode_Check(parts.ptr())) {
    throw pyb::type_error("parts must be a list of names, not a string");
  }
  unsigned bits = 0;
  for (pyb::handle name : parts) {
    const unsigned bit = plan_part(pyb::cast<std::string>(name));
    if (bit == 0) {
      throw pyb::value_error("unknown plan part '" + pyb::cast<std::string>(name) +
                             "' (schema, scenario, model_summary, memory, communication, "
                             "compute, stage_costs, time)");
    }
    bits |= bit;
  }
  return bits;
}

// errors=: "raise" (the first bad scenario raises, its path starting with its index) or "return"
// (each bad scenario's InputError stands in its place, its path inside that scenario).
bool return_errors(pyb::handle errors) {
  const std::string mode = pyb::cast<std::string>(errors);
  if (mode == "raise") return false;
  if (mode == "return") return true;
  throw pyb::value_error("errors must be \"raise\" or \"return\", not \"" + mode + "\"");
}

// Plans a list of scenarios in small blocks: each block's inputs are read with the GIL held,
// planned without it, and its answers converted with it again. Small blocks keep the documents in
// cache between building and converting, and memory bounded for long sweeps.
// Runs `work` off the interpreter and still answers Ctrl-C (issue 29, item 13): the calling
// thread looks at Python's signal handlers every 50 ms; when one raises (KeyboardInterrupt),
// `cancel` asks the work to stop at its next check and the exception is raised once the work
// has returned.
template <typename Work>
auto interruptible(Work&& work, std::atomic<bool>& cancel) {
  auto task = std::async(std::launch::async, std::forward<Work>(work));
  for (;;) {
    {
      pyb::gil_scoped_release nogil;
      if (task.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) break;
    }
    if (PyErr_CheckSignals() != 0) {
      cancel = true;
      {
        pyb::gil_scoped_release nogil;
        task.wait();
      }
      throw pyb::error_already_set();
    }
  }
  return task.get();
}

// The Python objects of a plan document take about this many bytes per byte of its JSON text
// (tracemalloc over 500 plans: 2.2 whole, 2.1-2.3 for memory + time, 2.7 for time alone;
// python/distplan, CPython 3.11); the bound below rounds it up.
constexpr double kPythonBytesPerJsonByte = 3.0;

pyb::list plan_many(pyb::handle scenarios, pyb::handle parts_arg, pyb::handle errors,
                    double max_result_gib) {
  if (!(max_result_gib > 0) || !std::isfinite(max_result_gib))
    throw pyb::value_error("max_result_gib must be a finite number > 0");
  const unsigned parts = plan_parts(parts_arg);
  const bool keep_going = return_errors(errors);
  const GcPause no_gc;
  PyObject* seq = PySequence_Fast(scenarios.ptr(), "plan_many takes a list of scenarios");
  if (seq == nullptr) throw pyb::error_already_set();
  const auto holder = pyb::reinterpret_steal<pyb::object>(seq);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  pyb::list result(n);
  constexpr Py_ssize_t kBlock = 16;
  std::vector<json> docs;
  std::vector<json> outs;
  // errors="return": the error of each failed scenario of the block (empty optional: planned).
  std::vector<std::optional<InputError>> failed;
  for (Py_ssize_t begin = 0; begin < n; begin += kBlock) {
    // Between blocks, with the interpreter held: Ctrl-C stops a long sweep (issue 29, item 13).
    if (PyErr_CheckSignals() != 0) throw pyb::error_already_set();
    const Py_ssize_t end = std::min(n, begin + kBlock);
    docs.clear();
    failed.assign(static_cast<std::size_t>(end - begin), std::nullopt);
    for (Py_ssize_t i = begin; i < end; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
      if (!keep_going) {
        docs.push_back(from_python(item, "/" + std::to_string(i)));
        continue;
      }
      try {
        docs.push_back(from_python(item));
      } catch (const InputError& e) {
        failed[static_cast<std::size_t>(i - begin)] = e;
        docs.emplace_back();
      }
    }
    outs.assign(docs.size(), json());
    {
      pyb::gil_scoped_release nogil;
      for (std::size_t k = 0; k < docs.size(); ++k) {
        if (failed[k]) continue;
        try {
          const Scenario s = scenario_from_json(docs[k]);
          outs[k] = plan_document(s, sim::plan(s), parts);
        } catch (const InputError& e) {
          if (keep_going) {
            failed[k] = e;
            continue;
          }
          // The list is the document: the error's pointer starts at the scenario's index.
          throw InputError("/" + std::to_string(begin + static_cast<Py_ssize_t>(k)) + e.path(),
                           e.what());
        }
      }
    }
    // Bound the answer before building it (issue 29, item 13): the first planned document's JSON
    // size stands for every one (a million whole documents would be about 30 GB).
    if (begin == 0) {
      for (std::size_t k = 0; k < outs.size(); ++k) {
        if (failed[k]) continue;
        const double each = static_cast<double>(outs[k].dump().size()) * kPythonBytesPerJsonByte;
        const double total = each * static_cast<double>(n);
        if (total > max_result_gib * 1073741824.0) {
          char msg[400];
          std::snprintf(msg, sizeof msg,
                        "plan_many: %lld plans would take about %.1f GiB as Python objects (about "
                        "%.0f KB each), over max_result_gib=%g; ask for the members you need with "
                        "parts= (e.g. ['memory', 'time']), plan the list in slices, or raise "
                        "max_result_gib",
                        static_cast<long long>(n), total / 1073741824.0, each / 1e3,
                        max_result_gib);
          throw pyb::value_error(msg);
        }
        break;
      }
    }
    for (std::size_t k = 0; k < outs.size(); ++k) {
      PyObject* o = failed[k] ? input_error_object(*failed[k]).release().ptr() : to_python(outs[k]);
      if (o == nullptr) throw pyb::error_already_set();
      PyList_SET_ITEM(result.ptr(), begin + static_cast<Py_ssize_t>(k), o);  // steals o
    }
  }
  return result;
}

// For bench/python_bench.py: plan_many's work on a list, phase by phase, in CPU seconds of this
// thread — reading the Python objects, parsing the scenarios, planning, building the plan
// documents, converting them to Python objects. The answers are dropped.
pyb::dict plan_many_phases(const pyb::list& items, pyb::handle parts_arg) {
  const unsigned parts = plan_parts(parts_arg);
  const GcPause no_gc;  // as plan_many
  const auto cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  double t0 = cpu();
  std::vector<json> docs;
  docs.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    docs.push_back(from_python(items[i].ptr(), "/" + std::to_string(i)));
  }
  double t1 = cpu();
  std::vector<Scenario> parsed;
  parsed.reserve(docs.size());
  for (const json& d : docs) parsed.push_back(scenario_from_json(d));
  double t2 = cpu();
  std::vector<Estimate> estimates;
  estimates.reserve(parsed.size());
  for (const Scenario& s : parsed) estimates.push_back(sim::plan(s));
  double t3 = cpu();
  std::vector<json> outs;
  outs.reserve(parsed.size());
  for (std::size_t i = 0; i < parsed.size(); ++i)
    outs.push_back(plan_document(parsed[i], estimates[i], parts));
  double t4 = cpu();
  {
    std::vector<pyb::object> objects;
    objects.reserve(outs.size());
    for (const json& o : outs) objects.push_back(to_object(o));
    const double t5 = cpu();
    pyb::dict phases;
    phases["read_python"] = t1 - t0;
    phases["parse_scenario"] = t2 - t1;
    phases["estimate"] = t3 - t2;
    phases["plan_to_json"] = t4 - t3;
    phases["to_python"] = t5 - t4;
    objects.clear();
    phases["free_python"] = cpu() - t5;
    return phases;
  }
}

pyb::object simulate(pyb::handle scenario, pyb::handle costs) {
  const json doc = from_python(scenario.ptr());
  std::optional<json> costs_doc;
  if (!costs.is_none()) costs_doc = from_python(costs.ptr(), "/costs");
  std::atomic<bool> cancel{false};
  // Off the interpreter, answering Ctrl-C (issue 29, item 13): the walk looks at `cancel`.
  const json out = interruptible(
      [&doc, &costs_doc, &cancel] {
        const Scenario s = scenario_from_json(doc, {"costs"});
        sim::SimOptions so;
        so.cancel = &cancel;
        if (doc.is_object() && doc.contains("costs")) {
          if (costs_doc) {
            throw InputError("/costs", "costs are given twice: in the scenario and as costs=");
          }
          so.costs = sim::cost_override_from_json(doc.at("costs"), "/costs");
        } else if (costs_doc) {
          so.costs = sim::cost_override_from_json(*costs_doc, "/costs");
        }
        const Estimate e = estimate(s);
        return sim::simulate_to_json(s, sim::simulate(s, e, so));
      },
      cancel);
  return to_object(out);
}

pyb::object search_layouts(pyb::handle request) {
  const json doc = from_python(request.ptr());
  std::atomic<bool> cancel{false};
  const json out = interruptible(
      [&doc, &cancel] {
        search::Request req = search::request_from_json(doc);
        req.options.cancel = &cancel;
        return search::result_to_json(req, search::run(req.space, req.options));
      },
      cancel);
  return to_object(out);
}

// Fits the named time assumptions to measured runs, as `distplan calibrate` does: `runs` is a runs
// document ({"runs": [...]}), a list of runs, or a distplan.validate/v1 result; `fit` names the
// assumptions to fit (default: every one the runs constrain).
pyb::object calibrate_runs(pyb::handle runs, pyb::handle fit) {
  json doc = from_python(runs.ptr());
  if (doc.is_array()) doc = json{{"runs", std::move(doc)}};
  CalibrationOptions co;
  co.step_seconds = sim::plan_step_seconds;
  if (!fit.is_none()) {
    if (PyUnicode_Check(fit.ptr())) throw pyb::type_error("fit must be a list of names");
    for (pyb::handle name : fit) co.parameters.push_back(pyb::cast<std::string>(name));
  }
  json out;
  {
    pyb::gil_scoped_release nogil;
    const std::vector<CalibrationRun> parsed = calibration_runs_from_json(doc);
    out = calibration_to_json(calibrate(parsed, co), parsed);
  }
  return to_object(out);
}

// A scenario's layout as a framework's launch settings (search::export_checked, as `distplan
// export --to FORMAT [--force]`): the text with its notes and what the user still adds. A layout
// that does not fit, or one the framework cannot run, raises InputError at its path.
pyb::object export_layout(pyb::handle scenario, const std::string& to, bool force) {
  const json doc = from_python(scenario.ptr());
  std::optional<search::ExportFormat> format;
  for (search::ExportFormat f : {search::ExportFormat::megatron, search::ExportFormat::deepspeed,
                                 search::ExportFormat::torchtitan}) {
    if (search::to_string(f) == to) format = f;
  }
  if (!format) {
    throw InputError("", "export to megatron, deepspeed or torchtitan, not '" + to + "'");
  }
  json out;
  {
    pyb::gil_scoped_release nogil;
    const Scenario s = scenario_from_json(doc);
    const search::Exported e = search::export_checked(s, *format, force);
    out = {{"to", to},
           {"text", e.text},
           {"notes", e.notes},
           {"to_add", e.to_add},
           {"fits", e.fits},
           {"peak_bytes", e.peak_bytes},
           {"capacity_bytes", e.capacity_bytes}};
    if (!e.fits) out["warning"] = search::fit_warning(e);
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
  m.doc() =
      "distplan's C++ core: plan, plan_many, simulate, search, calibrate, presets (docs/python.md)";
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
  m.def(
      "plan_many", &plan_many, pyb::arg("scenarios"), pyb::arg("parts") = pyb::none(),
      pyb::arg("errors") = "raise", pyb::arg("max_result_gib") = 8.0,
      "plan() of each scenario of a list, in order. parts: only these top-level members of each "
      "plan document (e.g. ['memory', 'time']). errors='raise': the first bad scenario raises "
      "InputError, its path starting with the index; errors='return': each bad scenario's "
      "InputError stands in its place in the list, its path inside that scenario. max_result_gib: "
      "the largest answer it builds (about 3 bytes of Python objects per byte of JSON); a "
      "larger one raises ValueError before it is built.");
  m.def("_plan_many_phases", &plan_many_phases, pyb::arg("scenarios"),
        pyb::arg("parts") = pyb::none(),
        "plan_many's CPU seconds per phase on this list (bench/python_bench.py).");
  m.def("simulate", &simulate, pyb::arg("scenario"), pyb::arg("costs") = pyb::none(),
        "Discrete-event simulation of one training step (distplan.simulate/v1).");
  m.def("search", &search_layouts, pyb::arg("request"),
        "The best layouts of a model on a cluster (distplan.search/v1).");
  m.def("calibrate", &calibrate_runs, pyb::arg("runs"), pyb::arg("fit") = pyb::none(),
        "Fits the named time assumptions to measured runs (distplan.calibration/v1).");
  m.def("_export", &export_layout, pyb::arg("scenario"), pyb::arg("to"), pyb::arg("force") = false,
        "A scenario's layout as megatron | deepspeed | torchtitan launch settings.");
  m.def("presets", &presets, "The model and GPU presets (distplan.presets/v1).");
  m.def("default_scenario", &default_scenario_document,
        "The embedded example scenario (Llama-2-70B on 64 x H100-SXM-80GB), as a dict.");
}
