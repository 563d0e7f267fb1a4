#include "plansession.h"

#include <exception>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"

#ifdef DISTPLAN_GUI_HAVE_SIMULATOR
#include "simulationadapter.h"
#endif

namespace distplan::gui {

namespace {
// Long enough to coalesce a burst of spin-box steps, short enough to feel live.
constexpr int kSimulationDebounceMs = 120;
}  // namespace

PlanSession::PlanSession(QObject* parent)
    : QObject(parent), document_(std::make_unique<nlohmann::json>(nlohmann::json::object())) {
  simulationTimer_.setSingleShot(true);
  simulationTimer_.setInterval(kSimulationDebounceMs);
  connect(&simulationTimer_, &QTimer::timeout, this, &PlanSession::runSimulation);
}

PlanSession::~PlanSession() = default;

const nlohmann::json& PlanSession::document() const {
  return *document_;
}

void PlanSession::setDocument(const nlohmann::json& doc) {
  *document_ = doc;
  try {
    Scenario s = scenario_from_json(doc);
    Estimate e = distplan::estimate(s);
    scenario_ = std::move(s);
    estimate_ = std::move(e);
    valid_ = true;
    errorPath_.clear();
    errorMessage_.clear();
  } catch (const InputError& err) {
    valid_ = false;
    errorPath_ = QString::fromStdString(err.path());
    errorMessage_ = QString::fromUtf8(err.what());
  } catch (const std::exception& err) {
    // An internal failure of the model must not take the window down: report it like bad input.
    valid_ = false;
    errorPath_.clear();
    errorMessage_ = tr("internal error: %1").arg(QString::fromUtf8(err.what()));
  }
  if (!valid_) {
    simulationTimer_.stop();
    emit planInvalid(errorPath_, errorMessage_);
    return;
  }
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

void PlanSession::simulateNow() {
  if (!valid_) return;
  simulationTimer_.stop();
  runSimulation();
}

void PlanSession::runSimulation() {
  if (!valid_ || !scenario_) return;
#ifdef DISTPLAN_GUI_HAVE_SIMULATOR
  try {
    simulation_ = simulateScenario(*scenario_, estimate_);
  } catch (const std::exception& err) {
    simulation_.reset();
    errorMessage_ = tr("simulation failed: %1").arg(QString::fromUtf8(err.what()));
  }
  emit simulationChanged();
#endif
}

}  // namespace distplan::gui
