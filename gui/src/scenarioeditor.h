// The scenario editor: model, GPU/cluster, training, parallel layout and modelling assumptions.
// Presets come from the planner; discrete choices offer only values the layout admits (tp among
// the divisors of the head count, ...). The editor builds a scenario document per the JSON
// contract; it never validates or clamps on its own: the planner's validator decides, and its
// message is shown next to the field its JSON path names.
#pragma once

#include <optional>

#include <QHash>
#include <QWidget>
#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/spec.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QFormLayout;
class QLabel;
class QSpinBox;

namespace distplan::gui {

class ScenarioEditor : public QWidget {
  Q_OBJECT

 public:
  explicit ScenarioEditor(QWidget* parent = nullptr);

  /// Shows `s` in the fields (the model and GPU preset combos pick the presets `s` names).
  void setScenario(const Scenario& s);
  /// The scenario document the fields describe (dp omitted when "auto").
  [[nodiscard]] nlohmann::json document() const;

  /// Marks the field whose JSON path is the longest prefix of `path` and shows `message` beside it.
  void showError(const QString& path, const QString& message);
  void clearError();
  /// The message currently shown for `path`'s field (empty when none); tests read it.
  [[nodiscard]] QString errorText() const;

 signals:
  /// Any field changed; read document().
  void edited();

 private:
  struct Field {
    QWidget* editor = nullptr;
    QLabel* error = nullptr;
  };

  QWidget* addRow(QFormLayout* form, const QString& label, QWidget* editor, const QString& path);
  QSpinBox* addCount(QFormLayout* form, const QString& label, const QString& path, int min,
                     int max);
  QDoubleSpinBox* addReal(QFormLayout* form, const QString& label, const QString& path, double min,
                          double max, int decimals, const QString& suffix);
  QComboBox* addChoice(QFormLayout* form, const QString& label, const QString& path,
                       const QStringList& values);
  QCheckBox* addCheck(QFormLayout* form, const QString& label, const QString& path);

  void buildModelGroup(QFormLayout* form);
  void buildClusterGroup(QFormLayout* form);
  void buildTrainingGroup(QFormLayout* form);
  void buildParallelGroup(QFormLayout* form);
  void buildAssumptionsGroup(QFormLayout* form);

  void applyModelPreset(const QString& name);
  void applyGpuPreset(const QString& name);
  void setModelFields(const ModelSpec& m);
  void setGpuFields(const GpuSpec& g);
  [[nodiscard]] ModelSpec modelFromFields() const;
  [[nodiscard]] GpuSpec gpuFromFields() const;
  /// Refills the discrete choices (tp, pp, dp, kv heads) from the fields they depend on.
  void refreshChoices();
  void fieldChanged();

  bool updating_ = false;  // true while the editor itself sets fields
  QHash<QString, Field> fields_;
  QLabel* generalError_ = nullptr;
  QString errorPath_;

  // Model.
  QComboBox* modelPreset_ = nullptr;
  QSpinBox* numLayers_ = nullptr;
  QSpinBox* hiddenSize_ = nullptr;
  QSpinBox* heads_ = nullptr;
  QComboBox* kvHeads_ = nullptr;
  QSpinBox* ffnHidden_ = nullptr;
  QSpinBox* vocab_ = nullptr;
  QComboBox* mlp_ = nullptr;
  QComboBox* norm_ = nullptr;
  QComboBox* positionEmbedding_ = nullptr;
  QSpinBox* maxPositions_ = nullptr;
  QCheckBox* tiedEmbeddings_ = nullptr;
  QCheckBox* bias_ = nullptr;
  // Cluster.
  QComboBox* gpuPreset_ = nullptr;
  QDoubleSpinBox* gpuMemoryGiB_ = nullptr;
  QDoubleSpinBox* gpuBf16Tflops_ = nullptr;
  QDoubleSpinBox* gpuFp16Tflops_ = nullptr;
  QDoubleSpinBox* gpuFp32Tflops_ = nullptr;
  QDoubleSpinBox* gpuHbmGBs_ = nullptr;
  QSpinBox* numGpus_ = nullptr;
  QSpinBox* gpusPerNode_ = nullptr;
  QDoubleSpinBox* intraGBs_ = nullptr;
  QDoubleSpinBox* interGBs_ = nullptr;
  QDoubleSpinBox* runtimeReserveGiB_ = nullptr;
  // Training.
  QSpinBox* seqLength_ = nullptr;
  QSpinBox* globalBatch_ = nullptr;
  QSpinBox* microBatch_ = nullptr;
  QComboBox* precision_ = nullptr;
  QComboBox* optimizer_ = nullptr;
  QComboBox* gradAccumDtype_ = nullptr;
  QComboBox* attention_ = nullptr;
  QDoubleSpinBox* dropout_ = nullptr;
  // Parallel.
  QComboBox* tp_ = nullptr;
  QComboBox* pp_ = nullptr;
  QComboBox* dp_ = nullptr;
  QComboBox* zeroStage_ = nullptr;
  QSpinBox* fsdpShard_ = nullptr;
  QCheckBox* sequenceParallel_ = nullptr;
  QComboBox* recompute_ = nullptr;
  QComboBox* schedule_ = nullptr;
  QSpinBox* virtualStages_ = nullptr;
  // Assumptions.
  QDoubleSpinBox* computeEfficiency_ = nullptr;
  QDoubleSpinBox* communicationEfficiency_ = nullptr;

  std::optional<ModelSpec> presetModel_;  // the preset the model fields started from
  std::optional<GpuSpec> presetGpu_;
  ClusterSpec loadedCluster_;  // link defaults the loaded scenario filled in
};

}  // namespace distplan::gui
