// The open scenario document and everything computed from it. Validation, the estimate and the
// simulation run on worker threads; their answers are applied on the UI thread, and an answer for
// a document that has since changed is dropped. Views listen to the signals and read the values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <QObject>
#include <QString>
#include <QThreadPool>
#include <QTimer>
#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/report.h"
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
  std::shared_ptr<const TimelineData> timeline;  // indexed on the worker, shared with the view
};

class PlanSession : public QObject {
  Q_OBJECT

 public:
  explicit PlanSession(QObject* parent = nullptr);
  ~PlanSession() override;

  /// Validates and estimates `doc` (a scenario document per the JSON contract) on a worker. When
  /// the answer arrives: planChanged() and, after a short debounce, the simulation; or
  /// planInvalid().
  void setDocument(const nlohmann::json& doc);
  [[nodiscard]] const nlohmann::json& document() const;

  [[nodiscard]] bool isValid() const { return valid_; }
  /// True while the answer for the current document has not arrived.
  [[nodiscard]] bool isPlanning() const { return planPending_; }
  /// The last valid scenario and its estimate (kept while the document is invalid).
  [[nodiscard]] bool hasPlan() const { return scenario_.has_value(); }
  [[nodiscard]] const Scenario& scenario() const { return *scenario_; }
  [[nodiscard]] const Estimate& estimate() const { return estimate_; }
  /// The planner's fit suggestions for the plan (re-planned alternatives, on the worker).
  [[nodiscard]] const std::vector<FitSuggestion>& suggestions() const { return suggestions_; }
  [[nodiscard]] QString errorPath() const { return errorPath_; }
  [[nodiscard]] QString errorMessage() const { return errorMessage_; }
  /// The `distplan.plan/v1` document of the current plan, indented.
  [[nodiscard]] QByteArray planJson() const;

  [[nodiscard]] bool hasSimulation() const { return simulation_.has_value(); }
  [[nodiscard]] bool isSimulating() const { return simulationPending_; }
  [[nodiscard]] const SimulationSummary& simulation() const { return *simulation_; }
  [[nodiscard]] static bool simulatorAvailable();

  /// Waits (running the event loop) until the current document's plan has arrived.
  bool waitForPlan(int timeoutMs = 120000);
  /// Runs the pending simulation now and waits for it (tests and screenshots).
  void simulateNow();

 signals:
  void planChanged();
  void planInvalid(const QString& path, const QString& message);
  void simulationChanged();

 private:
  struct PlanAnswer;
  void applyPlan(std::uint64_t generation, const std::shared_ptr<PlanAnswer>& answer);
  void startSimulation();

  std::unique_ptr<nlohmann::json> document_;
  bool valid_ = false;
  std::optional<Scenario> scenario_;
  Estimate estimate_;
  std::vector<FitSuggestion> suggestions_;
  QString errorPath_;
  QString errorMessage_;
  std::optional<SimulationSummary> simulation_;
  QTimer simulationTimer_;
  std::uint64_t generation_ = 0;     // of the current document
  std::uint64_t simGeneration_ = 0;  // of the simulation asked for last
  bool planPending_ = false;
  bool simulationPending_ = false;
  // Owned pools, so the destructor can wait for the workers that post to this object. Plans
  // have their own, so a long stale simulation never delays the next plan.
  QThreadPool planPool_;
  QThreadPool simulationPool_;
};

}  // namespace distplan::gui
