// The open scenario and everything computed from it. Every change of the scenario document is
// validated and estimated at once (microseconds); the simulation follows on a short debounce so
// typing stays fluid. Views listen to the signals and read the values.
#pragma once

#include <memory>
#include <optional>

#include <QObject>
#include <QString>
#include <QTimer>
#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"
#include "timelinedata.h"

namespace distplan::gui {

/// The simulator's figures for one step (absent until the simulation has run).
struct SimulationSummary {
  double step_seconds = 0;
  double bubble_fraction = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  std::vector<double> stage_busy_seconds;
  TimelineData timeline;
};

class PlanSession : public QObject {
  Q_OBJECT

 public:
  explicit PlanSession(QObject* parent = nullptr);
  ~PlanSession() override;

  /// Validates and estimates `doc` (a scenario document per the JSON contract). On success emits
  /// planChanged() and schedules the simulation; on invalid input emits planInvalid().
  void setDocument(const nlohmann::json& doc);
  [[nodiscard]] const nlohmann::json& document() const;

  [[nodiscard]] bool isValid() const { return valid_; }
  /// The last valid scenario and its estimate (kept while the document is invalid).
  [[nodiscard]] bool hasPlan() const { return scenario_.has_value(); }
  [[nodiscard]] const Scenario& scenario() const { return *scenario_; }
  [[nodiscard]] const Estimate& estimate() const { return estimate_; }
  [[nodiscard]] QString errorPath() const { return errorPath_; }
  [[nodiscard]] QString errorMessage() const { return errorMessage_; }
  /// The `distplan.plan/v1` document of the current plan, indented.
  [[nodiscard]] QByteArray planJson() const;

  [[nodiscard]] bool hasSimulation() const { return simulation_.has_value(); }
  [[nodiscard]] const SimulationSummary& simulation() const { return *simulation_; }
  [[nodiscard]] static bool simulatorAvailable();
  /// Runs the pending simulation now (tests and screenshots do not wait for the debounce).
  void simulateNow();

 signals:
  void planChanged();
  void planInvalid(const QString& path, const QString& message);
  void simulationChanged();

 private:
  void runSimulation();

  std::unique_ptr<nlohmann::json> document_;
  bool valid_ = false;
  std::optional<Scenario> scenario_;
  Estimate estimate_;
  QString errorPath_;
  QString errorMessage_;
  std::optional<SimulationSummary> simulation_;
  QTimer simulationTimer_;
};

}  // namespace distplan::gui
