#include "scenarioeditor.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QLabel>
#include <QSpinBox>
#include <QVBoxLayout>
#include <nlohmann/json.hpp>

#include "distplan/planner/presets.h"

namespace distplan::gui {

namespace {

constexpr double kGB = 1e9;     // link and HBM bandwidths are quoted in GB/s (10^9)
constexpr double kTera = 1e12;  // peak FLOP/s in TFLOP/s

QString qs(std::string_view v) {
  return QString::fromUtf8(v.data(), static_cast<int>(v.size()));
}

template <typename Enum, std::size_t N>
QStringList enumNames(const std::array<Enum, N>& values) {
  QStringList names;
  for (Enum v : values) names << qs(to_string(v));
  return names;
}

template <typename Enum, std::size_t N>
Enum enumFromCombo(const QComboBox* box, const std::array<Enum, N>& values) {
  const int i = box->currentIndex();
  return values[static_cast<std::size_t>(std::clamp(i, 0, static_cast<int>(N) - 1))];
}

template <typename Enum, std::size_t N>
void setEnumCombo(QComboBox* box, const std::array<Enum, N>& values, Enum v) {
  const auto it = std::find(values.begin(), values.end(), v);
  box->setCurrentIndex(static_cast<int>(it - values.begin()));
}

constexpr std::array kMlps = {Mlp::gelu, Mlp::swiglu};
constexpr std::array kNorms = {Norm::layernorm, Norm::rmsnorm};
constexpr std::array kPositions = {PositionEmbedding::learned, PositionEmbedding::rotary};
constexpr std::array kDTypes = {DType::fp32, DType::fp16, DType::bf16};
constexpr std::array kOptimizers = {Optimizer::adamw, Optimizer::adam, Optimizer::sgd};
constexpr std::array kAttentions = {Attention::flash, Attention::standard};
constexpr std::array kRecomputes = {Recompute::none, Recompute::selective, Recompute::full};
constexpr std::array kSchedules = {Schedule::gpipe, Schedule::one_f_one_b,
                                   Schedule::interleaved_1f1b, Schedule::zb_h1, Schedule::zb_h2};

std::vector<Count> divisors(Count n) {
  std::vector<Count> out;
  for (Count d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

/// Offers `values`; keeps `current` selected even when it is not among them (marked), so a value
/// read from a file is never silently replaced by another.
void setIntChoices(QComboBox* box, const std::vector<Count>& values, Count current,
                   const QString& autoText = {}) {
  box->clear();
  if (!autoText.isEmpty()) box->addItem(autoText, QVariant::fromValue<qlonglong>(-1));
  for (Count v : values) box->addItem(QString::number(v), QVariant::fromValue<qlonglong>(v));
  int index = box->findData(QVariant::fromValue<qlonglong>(current));
  if (index < 0) {
    box->addItem(QCoreApplication::translate("ScenarioEditor", "%1 (not offered)").arg(current),
                 QVariant::fromValue<qlonglong>(current));
    index = box->count() - 1;
  }
  box->setCurrentIndex(index);
}

Count intChoice(const QComboBox* box) {
  return box->currentData().toLongLong();
}

QString presetBaseName(const std::string& name) {
  QString n = QString::fromStdString(name);
  const QString suffix = QStringLiteral(" (modified)");
  if (n.endsWith(suffix)) n.chop(suffix.size());
  return n;
}

}  // namespace

ScenarioEditor::ScenarioEditor(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  generalError_ = new QLabel(this);
  generalError_->setObjectName(QStringLiteral("error:"));
  generalError_->setWordWrap(true);
  generalError_->setStyleSheet(QStringLiteral("color: #b00020; font-weight: bold;"));
  generalError_->hide();
  layout->addWidget(generalError_);

  auto group = [&](const QString& title, auto build) {
    auto* box = new QGroupBox(title, this);
    auto* form = new QFormLayout(box);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    (this->*build)(form);
    layout->addWidget(box);
  };
  group(tr("Model"), &ScenarioEditor::buildModelGroup);
  group(tr("GPU and cluster"), &ScenarioEditor::buildClusterGroup);
  group(tr("Training"), &ScenarioEditor::buildTrainingGroup);
  group(tr("Parallel layout"), &ScenarioEditor::buildParallelGroup);
  group(tr("Assumptions"), &ScenarioEditor::buildAssumptionsGroup);
  layout->addStretch(1);
}

QWidget* ScenarioEditor::addRow(QFormLayout* form, const QString& label, QWidget* editor,
                                const QString& path) {
  editor->setObjectName(path);
  auto* cell = new QWidget(this);
  auto* v = new QVBoxLayout(cell);
  v->setContentsMargins(0, 0, 0, 0);
  v->setSpacing(1);
  v->addWidget(editor);
  auto* error = new QLabel(cell);
  error->setObjectName(QStringLiteral("error:") + path);
  error->setWordWrap(true);
  error->setStyleSheet(QStringLiteral("color: #b00020;"));
  error->hide();
  v->addWidget(error);
  form->addRow(label, cell);
  fields_.insert(path, Field{editor, error});
  return cell;
}

QSpinBox* ScenarioEditor::addCount(QFormLayout* form, const QString& label, const QString& path,
                                   int min, int max) {
  auto* box = new QSpinBox(this);
  box->setRange(min, max);
  box->setKeyboardTracking(false);
  box->setGroupSeparatorShown(true);
  connect(box, &QSpinBox::valueChanged, this, &ScenarioEditor::fieldChanged);
  addRow(form, label, box, path);
  return box;
}

QDoubleSpinBox* ScenarioEditor::addReal(QFormLayout* form, const QString& label,
                                        const QString& path, double min, double max, int decimals,
                                        const QString& suffix) {
  auto* box = new QDoubleSpinBox(this);
  box->setRange(min, max);
  box->setDecimals(decimals);
  box->setSuffix(suffix);
  box->setKeyboardTracking(false);
  connect(box, &QDoubleSpinBox::valueChanged, this, &ScenarioEditor::fieldChanged);
  addRow(form, label, box, path);
  return box;
}

QComboBox* ScenarioEditor::addChoice(QFormLayout* form, const QString& label, const QString& path,
                                     const QStringList& values) {
  auto* box = new QComboBox(this);
  box->addItems(values);
  connect(box, &QComboBox::currentIndexChanged, this, &ScenarioEditor::fieldChanged);
  addRow(form, label, box, path);
  return box;
}

QCheckBox* ScenarioEditor::addCheck(QFormLayout* form, const QString& label, const QString& path) {
  auto* box = new QCheckBox(this);
  connect(box, &QCheckBox::toggled, this, &ScenarioEditor::fieldChanged);
  addRow(form, label, box, path);
  return box;
}

void ScenarioEditor::buildModelGroup(QFormLayout* form) {
  modelPreset_ = new QComboBox(this);
  for (const PresetInfo& p : model_presets()) {
    modelPreset_->addItem(QString::fromStdString(p.name), QString::fromStdString(p.name));
    modelPreset_->setItemData(modelPreset_->count() - 1, QString::fromStdString(p.description),
                              Qt::ToolTipRole);
  }
  modelPreset_->addItem(tr("custom"), QString());
  connect(modelPreset_, &QComboBox::activated, this,
          [this](int index) { applyModelPreset(modelPreset_->itemData(index).toString()); });
  addRow(form, tr("Preset"), modelPreset_, QStringLiteral("/model"));
  numLayers_ = addCount(form, tr("Layers"), QStringLiteral("/model/num_layers"), 1, 100000);
  hiddenSize_ = addCount(form, tr("Hidden size"), QStringLiteral("/model/hidden_size"), 1, 1 << 20);
  heads_ = addCount(form, tr("Attention heads"), QStringLiteral("/model/num_attention_heads"), 1,
                    100000);
  kvHeads_ = addChoice(form, tr("KV heads"), QStringLiteral("/model/num_kv_heads"), {});
  ffnHidden_ =
      addCount(form, tr("FFN hidden size"), QStringLiteral("/model/ffn_hidden_size"), 1, 1 << 22);
  vocab_ = addCount(form, tr("Vocabulary"), QStringLiteral("/model/vocab_size"), 1, 1 << 24);
  mlp_ = addChoice(form, tr("MLP"), QStringLiteral("/model/mlp"), enumNames(kMlps));
  norm_ = addChoice(form, tr("Norm"), QStringLiteral("/model/norm"), enumNames(kNorms));
  positionEmbedding_ = addChoice(form, tr("Positions"), QStringLiteral("/model/position_embedding"),
                                 enumNames(kPositions));
  maxPositions_ = addCount(form, tr("Max positions"),
                           QStringLiteral("/model/max_position_embeddings"), 0, 1 << 24);
  tiedEmbeddings_ = addCheck(form, tr("Tied embeddings"), QStringLiteral("/model/tied_embeddings"));
  bias_ = addCheck(form, tr("Linear biases"), QStringLiteral("/model/bias"));
}

void ScenarioEditor::buildClusterGroup(QFormLayout* form) {
  gpuPreset_ = new QComboBox(this);
  for (const PresetInfo& p : gpu_presets()) {
    gpuPreset_->addItem(QString::fromStdString(p.name), QString::fromStdString(p.name));
    gpuPreset_->setItemData(gpuPreset_->count() - 1, QString::fromStdString(p.description),
                            Qt::ToolTipRole);
  }
  gpuPreset_->addItem(tr("custom"), QString());
  connect(gpuPreset_, &QComboBox::activated, this,
          [this](int index) { applyGpuPreset(gpuPreset_->itemData(index).toString()); });
  addRow(form, tr("GPU"), gpuPreset_, QStringLiteral("/cluster/gpu"));
  gpuMemoryGiB_ = addReal(form, tr("GPU memory"), QStringLiteral("/cluster/gpu/memory_bytes"), 0,
                          1e6, 2, tr(" GiB"));
  gpuBf16Tflops_ = addReal(form, tr("Peak bf16"), QStringLiteral("/cluster/gpu/peak_flops/bf16"), 0,
                           1e6, 1, tr(" TFLOP/s"));
  gpuFp16Tflops_ = addReal(form, tr("Peak fp16"), QStringLiteral("/cluster/gpu/peak_flops/fp16"), 0,
                           1e6, 1, tr(" TFLOP/s"));
  gpuFp32Tflops_ = addReal(form, tr("Peak fp32"), QStringLiteral("/cluster/gpu/peak_flops/fp32"), 0,
                           1e6, 1, tr(" TFLOP/s"));
  gpuHbmGBs_ = addReal(form, tr("HBM bandwidth"), QStringLiteral("/cluster/gpu/memory_bandwidth"),
                       0, 1e7, 0, tr(" GB/s"));
  numGpus_ = addCount(form, tr("GPUs"), QStringLiteral("/cluster/num_gpus"), 1, 1 << 20);
  gpusPerNode_ =
      addCount(form, tr("GPUs per node"), QStringLiteral("/cluster/gpus_per_node"), 1, 1024);
  intraGBs_ = addReal(form, tr("Intra-node link"), QStringLiteral("/cluster/intra_node_bandwidth"),
                      0, 1e6, 1, tr(" GB/s"));
  interGBs_ = addReal(form, tr("Inter-node link"), QStringLiteral("/cluster/inter_node_bandwidth"),
                      0, 1e6, 1, tr(" GB/s"));
  runtimeReserveGiB_ =
      addReal(form, tr("Runtime reserve"), QStringLiteral("/cluster/runtime_reserve_bytes"), 0, 1e4,
              2, tr(" GiB"));
}

void ScenarioEditor::buildTrainingGroup(QFormLayout* form) {
  seqLength_ =
      addCount(form, tr("Sequence length"), QStringLiteral("/training/seq_length"), 1, 1 << 24);
  globalBatch_ =
      addCount(form, tr("Global batch"), QStringLiteral("/training/global_batch_size"), 1, 1 << 24);
  microBatch_ =
      addCount(form, tr("Micro-batch"), QStringLiteral("/training/micro_batch_size"), 1, 1 << 16);
  precision_ =
      addChoice(form, tr("Precision"), QStringLiteral("/training/precision"), enumNames(kDTypes));
  optimizer_ = addChoice(form, tr("Optimizer"), QStringLiteral("/training/optimizer"),
                         enumNames(kOptimizers));
  QStringList gradTypes{tr("same as precision")};
  gradTypes << enumNames(kDTypes);
  gradAccumDtype_ = addChoice(form, tr("Gradient dtype"),
                              QStringLiteral("/training/grad_accumulation_dtype"), gradTypes);
  attention_ = addChoice(form, tr("Attention"), QStringLiteral("/training/attention"),
                         enumNames(kAttentions));
  dropout_ = addReal(form, tr("Dropout"), QStringLiteral("/training/dropout"), 0, 1, 3, {});
  dropout_->setSingleStep(0.05);
}

void ScenarioEditor::buildParallelGroup(QFormLayout* form) {
  tp_ = addChoice(form, tr("Tensor parallel (tp)"), QStringLiteral("/parallel/tp"), {});
  pp_ = addChoice(form, tr("Pipeline parallel (pp)"), QStringLiteral("/parallel/pp"), {});
  dp_ = addChoice(form, tr("Data parallel (dp)"), QStringLiteral("/parallel/dp"), {});
  zeroStage_ = addChoice(
      form, tr("ZeRO stage"), QStringLiteral("/parallel/zero_stage"),
      {QStringLiteral("0"), QStringLiteral("1"), QStringLiteral("2"), QStringLiteral("3")});
  fsdpShard_ = addCount(form, tr("ZeRO shard group"), QStringLiteral("/parallel/fsdp_shard_size"),
                        0, 1 << 20);
  fsdpShard_->setSpecialValueText(tr("dp (full sharding)"));
  sequenceParallel_ =
      addCheck(form, tr("Sequence parallel"), QStringLiteral("/parallel/sequence_parallel"));
  recompute_ = addChoice(form, tr("Recompute"), QStringLiteral("/parallel/recompute"),
                         enumNames(kRecomputes));
  schedule_ =
      addChoice(form, tr("Schedule"), QStringLiteral("/parallel/schedule"), enumNames(kSchedules));
  virtualStages_ =
      addCount(form, tr("Virtual stages"), QStringLiteral("/parallel/virtual_stages"), 1, 1024);
}

void ScenarioEditor::buildAssumptionsGroup(QFormLayout* form) {
  computeEfficiency_ = addReal(form, tr("Compute efficiency"),
                               QStringLiteral("/assumptions/compute_efficiency"), 0, 1, 2, {});
  computeEfficiency_->setSingleStep(0.05);
  communicationEfficiency_ =
      addReal(form, tr("Link efficiency"), QStringLiteral("/assumptions/communication_efficiency"),
              0, 1, 2, {});
  communicationEfficiency_->setSingleStep(0.05);
}

void ScenarioEditor::setModelFields(const ModelSpec& m) {
  numLayers_->setValue(static_cast<int>(m.num_layers));
  hiddenSize_->setValue(static_cast<int>(m.hidden_size));
  heads_->setValue(static_cast<int>(m.num_attention_heads));
  setIntChoices(kvHeads_, divisors(m.num_attention_heads),
                m.num_kv_heads > 0 ? m.num_kv_heads : m.num_attention_heads);
  ffnHidden_->setValue(static_cast<int>(m.ffn_hidden_size));
  vocab_->setValue(static_cast<int>(m.vocab_size));
  setEnumCombo(mlp_, kMlps, m.mlp);
  setEnumCombo(norm_, kNorms, m.norm);
  setEnumCombo(positionEmbedding_, kPositions, m.position_embedding);
  maxPositions_->setValue(static_cast<int>(m.max_position_embeddings));
  tiedEmbeddings_->setChecked(m.tied_embeddings);
  bias_->setChecked(m.bias);
}

void ScenarioEditor::setGpuFields(const GpuSpec& g) {
  gpuMemoryGiB_->setValue(to_gib(g.memory_bytes));
  gpuBf16Tflops_->setValue(g.peak_flops.bf16 / kTera);
  gpuFp16Tflops_->setValue(g.peak_flops.fp16 / kTera);
  gpuFp32Tflops_->setValue(g.peak_flops.fp32 / kTera);
  gpuHbmGBs_->setValue(g.memory_bandwidth / kGB);
}

ModelSpec ScenarioEditor::modelFromFields() const {
  ModelSpec m;
  m.name = modelPreset_->currentData().toString().toStdString();
  m.num_layers = numLayers_->value();
  m.hidden_size = hiddenSize_->value();
  m.num_attention_heads = heads_->value();
  m.num_kv_heads = intChoice(kvHeads_);
  m.ffn_hidden_size = ffnHidden_->value();
  m.vocab_size = vocab_->value();
  m.mlp = enumFromCombo(mlp_, kMlps);
  m.norm = enumFromCombo(norm_, kNorms);
  m.position_embedding = enumFromCombo(positionEmbedding_, kPositions);
  m.max_position_embeddings = maxPositions_->value();
  m.tied_embeddings = tiedEmbeddings_->isChecked();
  m.bias = bias_->isChecked();
  return m;
}

GpuSpec ScenarioEditor::gpuFromFields() const {
  GpuSpec g = presetGpu_.value_or(GpuSpec{});
  if (const QString preset = gpuPreset_->currentData().toString(); !preset.isEmpty()) {
    g.name = preset.toStdString();
  }
  // Fields the editor shows replace the preset's only when the person changed them, so the
  // rounding of a spin box never turns a preset into a custom GPU.
  auto changed = [](double shown, double original, double scale, int decimals) {
    return std::abs(shown - original / scale) > 0.5 * std::pow(10.0, -decimals);
  };
  if (changed(gpuMemoryGiB_->value(), static_cast<double>(g.memory_bytes), kGiB, 2)) {
    g.memory_bytes = static_cast<Bytes>(std::llround(gpuMemoryGiB_->value() * kGiB));
  }
  if (changed(gpuBf16Tflops_->value(), g.peak_flops.bf16, kTera, 1)) {
    g.peak_flops.bf16 = gpuBf16Tflops_->value() * kTera;
  }
  if (changed(gpuFp16Tflops_->value(), g.peak_flops.fp16, kTera, 1)) {
    g.peak_flops.fp16 = gpuFp16Tflops_->value() * kTera;
  }
  if (changed(gpuFp32Tflops_->value(), g.peak_flops.fp32, kTera, 1)) {
    g.peak_flops.fp32 = gpuFp32Tflops_->value() * kTera;
  }
  if (changed(gpuHbmGBs_->value(), g.memory_bandwidth, kGB, 0)) {
    g.memory_bandwidth = gpuHbmGBs_->value() * kGB;
  }
  return g;
}

void ScenarioEditor::applyModelPreset(const QString& name) {
  if (name.isEmpty()) {  // "custom": keep the fields, drop the preset
    presetModel_.reset();
    fieldChanged();
    return;
  }
  presetModel_ = find_model_preset(name.toStdString());
  if (!presetModel_) return;
  updating_ = true;
  setModelFields(*presetModel_);
  updating_ = false;
  fieldChanged();
}

void ScenarioEditor::applyGpuPreset(const QString& name) {
  if (name.isEmpty()) {
    presetGpu_.reset();
    fieldChanged();
    return;
  }
  presetGpu_ = find_gpu_preset(name.toStdString());
  if (!presetGpu_) return;
  updating_ = true;
  setGpuFields(*presetGpu_);
  intraGBs_->setValue(presetGpu_->intra_node_bandwidth / kGB);
  interGBs_->setValue(presetGpu_->inter_node_bandwidth / kGB);
  updating_ = false;
  fieldChanged();
}

void ScenarioEditor::setScenario(const Scenario& s) {
  updating_ = true;
  // The reader names a changed preset "<preset> (modified)": its baseline is still the preset.
  const QString modelName = presetBaseName(s.model.name);
  presetModel_ = find_model_preset(modelName.toStdString());
  int mi = presetModel_ ? modelPreset_->findData(modelName) : -1;
  modelPreset_->setCurrentIndex(mi >= 0 ? mi : modelPreset_->count() - 1);
  setModelFields(s.model);

  const QString gpuName = presetBaseName(s.cluster.gpu.name);
  presetGpu_ = find_gpu_preset(gpuName.toStdString());
  if (!presetGpu_) presetGpu_ = s.cluster.gpu;  // a custom GPU is its own baseline
  int gi = presetGpu_ ? gpuPreset_->findData(gpuName) : -1;
  gpuPreset_->setCurrentIndex(gi >= 0 ? gi : gpuPreset_->count() - 1);
  setGpuFields(s.cluster.gpu);
  loadedCluster_ = s.cluster;
  numGpus_->setValue(static_cast<int>(s.cluster.num_gpus));
  gpusPerNode_->setValue(static_cast<int>(s.cluster.gpus_per_node));
  intraGBs_->setValue(s.cluster.intra_node_bandwidth / kGB);
  interGBs_->setValue(s.cluster.inter_node_bandwidth / kGB);
  runtimeReserveGiB_->setValue(to_gib(s.cluster.runtime_reserve_bytes));

  seqLength_->setValue(static_cast<int>(s.training.seq_length));
  globalBatch_->setValue(static_cast<int>(s.training.global_batch_size));
  microBatch_->setValue(static_cast<int>(s.training.micro_batch_size));
  setEnumCombo(precision_, kDTypes, s.training.precision);
  setEnumCombo(optimizer_, kOptimizers, s.training.optimizer);
  if (s.training.grad_accumulation_dtype == s.training.precision) {
    gradAccumDtype_->setCurrentIndex(0);
  } else {
    const auto it = std::find(kDTypes.begin(), kDTypes.end(), s.training.grad_accumulation_dtype);
    gradAccumDtype_->setCurrentIndex(1 + static_cast<int>(it - kDTypes.begin()));
  }
  setEnumCombo(attention_, kAttentions, s.training.attention);
  dropout_->setValue(s.training.dropout);

  // tp, pp and dp are filled by refreshChoices from these seeds.
  setIntChoices(tp_, {}, s.parallel.tp);
  setIntChoices(pp_, {}, s.parallel.pp);
  const Count derivedDp = s.cluster.num_gpus / (s.parallel.tp * s.parallel.pp);
  setIntChoices(dp_, {}, s.parallel.dp == derivedDp ? -1 : s.parallel.dp, tr("auto"));
  zeroStage_->setCurrentIndex(s.parallel.zero_stage);
  fsdpShard_->setValue(static_cast<int>(
      s.parallel.fsdp_shard_size == s.parallel.dp ? 0 : s.parallel.fsdp_shard_size));
  sequenceParallel_->setChecked(s.parallel.sequence_parallel);
  setEnumCombo(recompute_, kRecomputes, s.parallel.recompute);
  setEnumCombo(schedule_, kSchedules, s.parallel.schedule);
  virtualStages_->setValue(static_cast<int>(s.parallel.virtual_stages));

  computeEfficiency_->setValue(s.assumptions.compute_efficiency);
  communicationEfficiency_->setValue(s.assumptions.communication_efficiency);
  refreshChoices();
  updating_ = false;
  clearError();
}

void ScenarioEditor::refreshChoices() {
  const bool wasUpdating = updating_;
  updating_ = true;
  const Count heads = heads_->value();
  const Count gpus = numGpus_->value();
  setIntChoices(kvHeads_, divisors(heads), intChoice(kvHeads_));

  // tp splits the heads and the GPUs; pp splits the layers and what tp leaves of the GPUs.
  const Count tp = intChoice(tp_);
  // tp must split the query heads, the KV heads and the FFN width (Megatron-LM's rules).
  const Count kv = intChoice(kvHeads_) > 0 ? intChoice(kvHeads_) : heads;
  setIntChoices(tp_, divisors(std::gcd(std::gcd(heads, kv), std::gcd(ffnHidden_->value(), gpus))),
                tp);
  std::vector<Count> pps;
  for (Count p : divisors(numLayers_->value())) {
    if (tp > 0 && gpus % (tp * p) == 0) pps.push_back(p);
  }
  const Count pp = intChoice(pp_);
  setIntChoices(pp_, pps, pp);

  // dp is what remains of the GPUs: "auto" derives it; an explicit value is kept as read.
  const Count current = intChoice(dp_);
  if (tp > 0 && pp > 0 && gpus % (tp * pp) == 0) {
    const Count dp = gpus / (tp * pp);
    setIntChoices(dp_, {dp}, current, tr("auto (%1)").arg(dp));
  } else {
    setIntChoices(dp_, {}, current, tr("auto"));
  }
  virtualStages_->setEnabled(enumFromCombo(schedule_, kSchedules) == Schedule::interleaved_1f1b);
  positionEmbedding_->setEnabled(true);
  maxPositions_->setEnabled(enumFromCombo(positionEmbedding_, kPositions) ==
                            PositionEmbedding::learned);
  updating_ = wasUpdating;
}

void ScenarioEditor::fieldChanged() {
  if (updating_) return;
  // The model preset combo follows the fields: once they differ it says so in its tooltip, and
  // the document carries the preset plus the overrides.
  refreshChoices();
  emit edited();
}

nlohmann::json ScenarioEditor::document() const {
  using nlohmann::json;
  json doc = json::object();

  // Model: a preset name while the fields equal the preset, else the preset plus overrides.
  const ModelSpec m = modelFromFields();
  const QString presetName = modelPreset_->currentData().toString();
  json model = json::object();
  const bool haveBase = presetModel_.has_value() && !presetName.isEmpty();
  const ModelSpec base = haveBase ? *presetModel_ : ModelSpec{};
  if (haveBase) model["preset"] = presetName.toStdString();
  auto put = [&](const char* key, auto value, auto baseValue) {
    if (!haveBase || value != baseValue) model[key] = value;
  };
  put("num_layers", m.num_layers, base.num_layers);
  put("hidden_size", m.hidden_size, base.hidden_size);
  put("num_attention_heads", m.num_attention_heads, base.num_attention_heads);
  put("num_kv_heads", m.num_kv_heads, base.num_kv_heads);
  put("ffn_hidden_size", m.ffn_hidden_size, base.ffn_hidden_size);
  put("vocab_size", m.vocab_size, base.vocab_size);
  put("mlp", std::string(to_string(m.mlp)), std::string(to_string(base.mlp)));
  put("norm", std::string(to_string(m.norm)), std::string(to_string(base.norm)));
  put("position_embedding", std::string(to_string(m.position_embedding)),
      std::string(to_string(base.position_embedding)));
  if (m.position_embedding == PositionEmbedding::learned) {
    put("max_position_embeddings", m.max_position_embeddings, base.max_position_embeddings);
  }
  put("tied_embeddings", m.tied_embeddings, base.tied_embeddings);
  put("bias", m.bias, base.bias);
  if (haveBase && model.size() == 1) {
    doc["model"] = presetName.toStdString();
  } else {
    doc["model"] = model;
  }

  // Cluster.
  json cluster = json::object();
  const GpuSpec g = gpuFromFields();
  const QString gpuName = gpuPreset_->currentData().toString();
  const std::optional<GpuSpec> gpuPreset = find_gpu_preset(gpuName.toStdString());
  if (gpuPreset && g == *gpuPreset) {
    cluster["gpu"] = gpuName.toStdString();
  } else {
    json gpu = json::object();
    if (gpuPreset) gpu["preset"] = gpuName.toStdString();
    gpu["memory_bytes"] = g.memory_bytes;
    gpu["peak_flops"] = {{"fp32", g.peak_flops.fp32},
                         {"tf32", g.peak_flops.tf32},
                         {"fp16", g.peak_flops.fp16},
                         {"bf16", g.peak_flops.bf16}};
    gpu["memory_bandwidth"] = g.memory_bandwidth;
    if (!gpuPreset) {  // a custom GPU names its own links
      gpu["name"] = g.name.empty() ? std::string("custom") : g.name;
      gpu["intra_node_bandwidth"] = g.intra_node_bandwidth;
      gpu["inter_node_bandwidth"] = g.inter_node_bandwidth;
    }
    cluster["gpu"] = gpu;
  }
  cluster["num_gpus"] = numGpus_->value();
  cluster["gpus_per_node"] = gpusPerNode_->value();
  // Link bandwidths default to the GPU's; written only when the person set other values.
  const double intra = intraGBs_->value() * kGB;
  const double inter = interGBs_->value() * kGB;
  if (std::abs(intra - g.intra_node_bandwidth) > 0.05 * kGB) {
    cluster["intra_node_bandwidth"] = intra;
  }
  if (std::abs(inter - g.inter_node_bandwidth) > 0.05 * kGB) {
    cluster["inter_node_bandwidth"] = inter;
  }
  const Bytes reserve = static_cast<Bytes>(std::llround(runtimeReserveGiB_->value() * kGiB));
  if (std::abs(runtimeReserveGiB_->value() - to_gib(loadedCluster_.runtime_reserve_bytes)) >
      0.005) {
    cluster["runtime_reserve_bytes"] = reserve;
  } else if (loadedCluster_.runtime_reserve_bytes > 0) {
    cluster["runtime_reserve_bytes"] = loadedCluster_.runtime_reserve_bytes;
  }
  doc["cluster"] = cluster;

  // Training.
  json training = json::object();
  training["seq_length"] = seqLength_->value();
  training["global_batch_size"] = globalBatch_->value();
  training["micro_batch_size"] = microBatch_->value();
  training["precision"] = std::string(to_string(enumFromCombo(precision_, kDTypes)));
  training["optimizer"] = std::string(to_string(enumFromCombo(optimizer_, kOptimizers)));
  if (gradAccumDtype_->currentIndex() > 0) {
    training["grad_accumulation_dtype"] = std::string(
        to_string(kDTypes[static_cast<std::size_t>(gradAccumDtype_->currentIndex() - 1)]));
  }
  training["attention"] = std::string(to_string(enumFromCombo(attention_, kAttentions)));
  if (dropout_->value() > 0) training["dropout"] = dropout_->value();
  doc["training"] = training;

  // Parallel.
  json parallel = json::object();
  parallel["tp"] = intChoice(tp_);
  parallel["pp"] = intChoice(pp_);
  if (intChoice(dp_) > 0) parallel["dp"] = intChoice(dp_);
  parallel["zero_stage"] = zeroStage_->currentIndex();
  if (fsdpShard_->value() > 0) parallel["fsdp_shard_size"] = fsdpShard_->value();
  parallel["sequence_parallel"] = sequenceParallel_->isChecked();
  parallel["recompute"] = std::string(to_string(enumFromCombo(recompute_, kRecomputes)));
  const Schedule schedule = enumFromCombo(schedule_, kSchedules);
  parallel["schedule"] = std::string(to_string(schedule));
  if (schedule == Schedule::interleaved_1f1b) parallel["virtual_stages"] = virtualStages_->value();
  doc["parallel"] = parallel;

  // Assumptions: only those that differ from the documented defaults.
  const Assumptions defaults;
  json assumptions = json::object();
  if (std::abs(computeEfficiency_->value() - defaults.compute_efficiency) > 1e-9) {
    assumptions["compute_efficiency"] = computeEfficiency_->value();
  }
  if (std::abs(communicationEfficiency_->value() - defaults.communication_efficiency) > 1e-9) {
    assumptions["communication_efficiency"] = communicationEfficiency_->value();
  }
  if (!assumptions.empty()) doc["assumptions"] = assumptions;
  return doc;
}

void ScenarioEditor::clearError() {
  for (const Field& f : std::as_const(fields_)) {
    f.error->hide();
    f.error->clear();
    f.editor->setStyleSheet({});
  }
  generalError_->hide();
  generalError_->clear();
  errorPath_.clear();
}

void ScenarioEditor::showError(const QString& path, const QString& message) {
  clearError();
  errorPath_ = path;
  // The field with the longest path that is `path` or one of its ancestors.
  QString best;
  for (auto it = fields_.cbegin(); it != fields_.cend(); ++it) {
    const QString& p = it.key();
    const bool matches = path == p || path.startsWith(p + QLatin1Char('/'));
    if (matches && p.size() > best.size()) best = p;
  }
  const QString text = path.isEmpty() ? message : tr("%1: %2").arg(path, message);
  if (best.isEmpty()) {
    generalError_->setText(text);
    generalError_->show();
    return;
  }
  const Field& f = fields_[best];
  f.error->setText(text);
  f.error->show();
  f.editor->setStyleSheet(QStringLiteral("border: 2px solid #b00020;"));
}

QString ScenarioEditor::errorText() const {
  if (!generalError_->text().isEmpty()) return generalError_->text();
  for (const Field& f : fields_) {
    if (!f.error->text().isEmpty()) return f.error->text();
  }
  return {};
}

}  // namespace distplan::gui
