#include "plansession.h"

#include <exception>

#include <QCoreApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"

#ifdef DISTPLAN_GUI_HAVE_SIMULATOR
#include "simulationadapter.h"
#endif

namespace distplan::gui {

namespace {
// Long enough to coalesce a burst of edits, short enough to feel live.
constexpr int kSimulationDebounceMs = 120;
}  // namespace

/// What a planning worker hands back.
struct PlanSession::PlanAnswer {
  std::optional<Scenario> scenario;
  Estimate estimate;
  std::vector<FitSuggestion> suggestions;
  QString errorPath;
  QString errorMessage;
};

PlanSession::PlanSession(QObject* parent)
    : QObject(parent), document_(std::make_unique<nlohmann::json>(nlohmann::json::object())) {
  simulationTimer_.setSingleShot(true);
  simulationTimer_.setInterval(kSimulationDebounceMs);
  connect(&simulationTimer_, &QTimer::timeout, this, &PlanSession::startSimulation);
  planPool_.setMaxThreadCount(1);
  simulationPool_.setMaxThreadCount(2);  // a stale simulation still running finishes alone
}

PlanSession::~PlanSession() {
  planPool_.clear();
  simulationPool_.clear();
  planPool_.waitForDone();
  simulationPool_.waitForDone();
}

const nlohmann::json& PlanSession::document() const {
  return *document_;
}

void PlanSession::setDocument(const nlohmann::json& doc) {
  *document_ = doc;
  const std::uint64_t generation = ++generation_;
  planPending_ = true;
  simulationPending_ = false;  // a simulation still running is for an older document
  simulationTimer_.stop();
  planPool_.clear();  // plans and simulations not yet started are for older documents
  simulationPool_.clear();
  planPool_.start([this, generation, doc = *document_] {
    auto answer = std::make_shared<PlanAnswer>();
    try {
      // A search document's `search` object is the search tab's; the plan reads the rest.
      Scenario s = scenario_from_json(doc, {"search"});
      answer->estimate = sim::plan(s);
      // The alternatives the summary offers are re-planned here too, off the UI thread.
      answer->suggestions =
          fit_suggestions(s, answer->estimate, [](const Scenario& x) { return sim::plan(x); });
      answer->scenario = std::move(s);
    } catch (const InputError& err) {
      answer->errorPath = QString::fromStdString(err.path());
      answer->errorMessage = QString::fromUtf8(err.what());
    } catch (const std::exception& err) {
      // An internal failure of the model must not take the window down: report it like bad input.
      answer->errorMessage = tr("internal error: %1").arg(QString::fromUtf8(err.what()));
    }
    QMetaObject::invokeMethod(
        this, [this, generation, answer] { applyPlan(generation, answer); }, Qt::QueuedConnection);
  });
}

void PlanSession::applyPlan(std::uint64_t generation, const std::shared_ptr<PlanAnswer>& answer) {
  if (generation != generation_) return;  // the document changed meanwhile
  planPending_ = false;
  if (!answer->scenario) {
    valid_ = false;
    errorPath_ = answer->errorPath;
    errorMessage_ = answer->errorMessage;
    emit planInvalid(errorPath_, errorMessage_);
    return;
  }
  valid_ = true;
  scenario_ = std::move(answer->scenario);
  estimate_ = std::move(answer->estimate);
  suggestions_ = std::move(answer->suggestions);
  errorPath_.clear();
  errorMessage_.clear();
  emit planChanged();
  simulationTimer_.start();
}

QByteArray PlanSession::planJson() const {
  if (!scenario_) return {};
  return QByteArray::fromStdString(plan_to_json(*scenario_, estimate_).dump(2));
}

bool PlanSession::simulatorAvailable() {
#ifdef DISTPLAN_GUI_HAVE_SIMULATOR
  return true;
#else
  return false;
#endif
}

bool PlanSession::waitForPlan(int timeoutMs) {
  QElapsedTimer clock;
  clock.start();
  while (planPending_ && clock.elapsed() < timeoutMs) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
  }
  return !planPending_;
}

void PlanSession::simulateNow() {
  if (!waitForPlan() || !valid_) return;
  if (simulationTimer_.isActive()) {
    simulationTimer_.stop();
    startSimulation();
  }
  QElapsedTimer clock;
  clock.start();
  while (simulationPending_ && clock.elapsed() < 600000) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
  }
}

void PlanSession::startSimulation() {
  if (!valid_ || !scenario_) return;
#ifdef DISTPLAN_GUI_HAVE_SIMULATOR
  const std::uint64_t generation = generation_;
  simGeneration_ = generation;
  simulationPending_ = true;
  simulationPool_.start([this, generation, s = *scenario_, e = estimate_] {
    auto result = std::make_shared<std::optional<SimulationSummary>>();
    auto error = std::make_shared<QString>();
    try {
      *result = simulateScenario(s, e);
    } catch (const std::exception& err) {
      *error = tr("simulation failed: %1").arg(QString::fromUtf8(err.what()));
    }
    QMetaObject::invokeMethod(
        this,
        [this, generation, result, error] {
          if (generation != simGeneration_ || generation != generation_) return;  // stale
          simulationPending_ = false;
          simulation_ = std::move(*result);
          if (!simulation_) errorMessage_ = *error;
          emit simulationChanged();
        },
        Qt::QueuedConnection);
  });
#endif
}

}  // namespace distplan::gui
