#include "scenarioeditor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QFormLayout>
#include <QGroupBox>
#include <QLabel>
#include <QSet>
#include <QVBoxLayout>

#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "valuefield.h"

namespace distplan::gui {

using nlohmann::json;

namespace {

QString qs(std::string_view v) {
  return QString::fromUtf8(v.data(), static_cast<qsizetype>(v.size()));
}

template <typename Enum, std::size_t N>
QStringList enumNames(const std::array<Enum, N>& values) {
  QStringList names;
  for (Enum v : values) names << qs(to_string(v));
  return names;
}

constexpr std::array kMlps = {Mlp::gelu, Mlp::swiglu, Mlp::geglu};
constexpr std::array kNorms = {Norm::layernorm, Norm::rmsnorm};
constexpr std::array kPositions = {PositionEmbedding::learned, PositionEmbedding::rotary,
                                   PositionEmbedding::alibi};
constexpr std::array kDTypes = {DType::fp32, DType::fp16, DType::bf16};
constexpr std::array kOptimizers = {Optimizer::adamw, Optimizer::adam, Optimizer::sgd};
constexpr std::array kAttentions = {Attention::flash, Attention::standard};
constexpr std::array kFrameworks = {Framework::generic, Framework::megatron, Framework::deepspeed,
                                    Framework::torchtitan};
constexpr std::array kRecomputes = {Recompute::none, Recompute::selective, Recompute::full,
                                    Recompute::selective_op};
constexpr std::array kSchedules = {
    Schedule::gpipe,      Schedule::one_f_one_b, Schedule::interleaved_1f1b,
    Schedule::zb_h1,      Schedule::zb_h2,       Schedule::zb_auto,
    Schedule::zb_v,       Schedule::v_half,      Schedule::v_min,
    Schedule::dualpipe_v, Schedule::dualpipe};

// Paths whose absence means "derived" rather than the resolved value: shown as their first item.
const QString kDpPath = QStringLiteral("/parallel/dp");
const QString kGradDtypePath = QStringLiteral("/training/grad_accumulation_dtype");

std::vector<Count> divisors(Count n) {
  std::vector<Count> low, high;
  for (Count d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

std::vector<std::string> pointerTokens(const std::string& path) {
  std::vector<std::string> tokens;
  if (path.empty()) return tokens;
  std::size_t pos = 1;
  while (true) {
    const std::size_t next = path.find('/', pos);
    std::string t = path.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    for (std::size_t i = 0; (i = t.find('~', i)) != std::string::npos; ++i) {
      if (i + 1 < t.size()) t.replace(i, 2, t[i + 1] == '1' ? "/" : "~");
    }
    tokens.push_back(std::move(t));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return tokens;
}

/// The value at `path` in `doc`, or nullptr.
const json* lookup(const json& doc, const std::string& path) {
  const json* node = &doc;
  for (const std::string& t : pointerTokens(path)) {
    if (!node->is_object()) return nullptr;
    const auto it = node->find(t);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

/// The preset a model or GPU document names, if any.
QString presetOf(const json& v) {
  if (v.is_string()) return QString::fromStdString(v.get<std::string>());
  if (v.is_object() && v.contains("preset") && v.at("preset").is_string()) {
    return QString::fromStdString(v.at("preset").get<std::string>());
  }
  return {};
}

/// Selects the item whose data is `data`, adding `text` for it when absent (a value read from the
/// document is shown, never replaced by another).
void selectOrAdd(QComboBox* box, const QVariant& data, const QString& text) {
  int index = data.isValid() ? box->findData(data) : -1;
  if (index < 0) {
    box->addItem(text, data);
    index = box->count() - 1;
  }
  box->setCurrentIndex(index);
}

void setItalic(QWidget* w, bool italic) {
  QFont f = w->font();
  f.setItalic(italic);
  w->setFont(f);
}

QString shortDump(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 160) text = text.substr(0, 160) + "…";
  return QString::fromStdString(text);
}

}  // namespace

void setDocumentValue(json& doc, const std::string& path, const json& value, bool keepNull) {
  const std::vector<std::string> tokens = pointerTokens(path);
  if (tokens.empty()) return;
  json* node = &doc;
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
    if (node->is_string()) {
      *node = json{{"preset", node->get<std::string>()}};  // a preset name keeps its preset
    } else if (!node->is_object()) {
      if (value.is_null() && !keepNull) return;
      *node = json::object();
    }
    const auto it = node->find(tokens[i]);
    if (it == node->end()) {
      if (value.is_null() && !keepNull) return;
      node = &(*node)[tokens[i]];
    } else {
      node = &*it;
    }
  }
  if (node->is_string()) *node = json{{"preset", node->get<std::string>()}};
  if (!node->is_object()) {
    if (value.is_null() && !keepNull) return;
    *node = json::object();
  }
  if (value.is_null() && !keepNull) {
    node->erase(tokens.back());
  } else {
    (*node)[tokens.back()] = value;
  }
}

ScenarioEditor::ScenarioEditor(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  generalError_ = new QLabel(this);
  generalError_->setObjectName(QStringLiteral("error:"));
  generalError_->setWordWrap(true);
  generalError_->setTextFormat(Qt::PlainText);
  generalError_->setStyleSheet(QStringLiteral("color: #b00020; font-weight: bold;"));
  generalError_->hide();
  layout->addWidget(generalError_);

  auto group = [&](const QString& title, auto build) {
    auto* box = new QGroupBox(title, this);
    auto* form = new QFormLayout(box);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    // A label too long for the pane puts its field on the next line rather than squeezing it.
    form->setRowWrapPolicy(QFormLayout::WrapLongRows);
    (this->*build)(form);
    layout->addWidget(box);
  };
  // What a person picks first (model, GPU, how many) and the layout come first, so at 1440 × 900
  // the whole layout is in view beside the results; the presets' details follow.
  group(tr("Model and cluster"), &ScenarioEditor::buildPresetsGroup);
  group(tr("Parallel layout"), &ScenarioEditor::buildParallelGroup);
  group(tr("Training"), &ScenarioEditor::buildTrainingGroup);
  group(tr("Fine-tuning"), &ScenarioEditor::buildPeftGroup);
  group(tr("Model shape"), &ScenarioEditor::buildModelGroup);
  group(tr("Mixture of Experts"), &ScenarioEditor::buildMoeGroup);
  group(tr("GPU and links"), &ScenarioEditor::buildClusterGroup);
  group(tr("Assumptions"), &ScenarioEditor::buildAssumptionsGroup);

  auto* other = new QGroupBox(tr("Other fields in the file"), this);
  other->setToolTip(tr("Kept as they are; edit the file to change them"));
  auto* otherLayout = new QVBoxLayout(other);
  otherFields_ = new QLabel(other);
  otherFields_->setObjectName(QStringLiteral("otherFields"));
  otherFields_->setTextFormat(Qt::PlainText);
  otherFields_->setWordWrap(true);
  otherFields_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  otherLayout->addWidget(otherFields_);
  otherBox_ = other;
  otherBox_->hide();
  layout->addWidget(other);
  layout->addStretch(1);
}

QWidget* ScenarioEditor::addRow(QFormLayout* form, const QString& label, QWidget* editor,
                                const QString& path, Kind kind) {
  editor->setObjectName(path);
  auto* cell = new QWidget(this);
  auto* v = new QVBoxLayout(cell);
  v->setContentsMargins(0, 0, 0, 0);
  v->setSpacing(1);
  v->addWidget(editor);
  auto* error = new QLabel(cell);
  error->setObjectName(QStringLiteral("error:") + path);
  error->setWordWrap(true);
  error->setTextFormat(Qt::PlainText);
  error->setStyleSheet(QStringLiteral("color: #b00020;"));
  error->hide();
  v->addWidget(error);
  form->addRow(label, cell);
  fields_.insert(path, Field{kind, editor, error});
  return cell;
}

ValueField* ScenarioEditor::addValue(QFormLayout* form, const QString& label, const QString& path,
                                     FieldUnit unit, const QString& unitText, bool connectEdit) {
  auto* field = new ValueField(unit, this);
  if (connectEdit) {
    connect(field, &ValueField::valueEdited, this,
            [this, path](const json& value) { editValue(path, value); });
  }
  addRow(form, unitText.isEmpty() ? label : tr("%1 (%2)").arg(label, unitText), field, path,
         Kind::value);
  return field;
}

QComboBox* ScenarioEditor::addChoice(QFormLayout* form, const QString& label, const QString& path,
                                     const QStringList& values) {
  auto* box = new QComboBox(this);
  for (const QString& v : values) box->addItem(v, v);
  connect(box, &QComboBox::activated, this, [this, box, path](int index) {
    const QVariant data = box->itemData(index);
    if (!data.isValid()) return;  // the document's own value, which no item names
    const QString text = data.toString();
    editValue(path, text.isEmpty() ? json(nullptr) : json(text.toStdString()));
  });
  addRow(form, label, box, path, Kind::choice);
  return box;
}

QComboBox* ScenarioEditor::addIntChoice(QFormLayout* form, const QString& label,
                                        const QString& path) {
  auto* box = new QComboBox(this);
  connect(box, &QComboBox::activated, this, [this, box, path](int index) {
    const QVariant data = box->itemData(index);
    if (!data.isValid()) return;
    const qlonglong v = data.toLongLong();
    editValue(path, v < 0 ? json(nullptr) : json(v));
  });
  addRow(form, label, box, path, Kind::intChoice);
  return box;
}

QCheckBox* ScenarioEditor::addCheck(QFormLayout* form, const QString& label, const QString& path) {
  auto* box = new QCheckBox(this);
  connect(box, &QCheckBox::clicked, this,
          [this, path](bool checked) { editValue(path, json(checked)); });
  addRow(form, label, box, path, Kind::check);
  return box;
}

QComboBox* ScenarioEditor::addPreset(QFormLayout* form, const QString& label, const QString& path,
                                     bool model) {
  auto* box = new QComboBox(this);
  for (const PresetInfo& p : model ? model_presets() : gpu_presets()) {
    box->addItem(QString::fromStdString(p.name), QString::fromStdString(p.name));
    box->setItemData(box->count() - 1, QString::fromStdString(p.description), Qt::ToolTipRole);
  }
  box->addItem(tr("custom"), QString());
  connect(box, &QComboBox::activated, this, [this, box, path, model](int index) {
    const QVariant data = box->itemData(index);
    if (!data.isValid()) return;
    presetChosen(path, data.toString(), model);
  });
  addRow(form, label, box, path, Kind::preset);
  return box;
}

void ScenarioEditor::buildPresetsGroup(QFormLayout* form) {
  addPreset(form, tr("Model"), QStringLiteral("/model"), true);
  addPreset(form, tr("GPU"), QStringLiteral("/cluster/gpu"), false);
  addValue(form, tr("GPUs"), QStringLiteral("/cluster/num_gpus"), FieldUnit::plain);
  addValue(form, tr("GPUs per node"), QStringLiteral("/cluster/gpus_per_node"), FieldUnit::plain);
}

void ScenarioEditor::buildModelGroup(QFormLayout* form) {
  addValue(form, tr("Name"), QStringLiteral("/model/name"), FieldUnit::plain);
  addValue(form, tr("Layers"), QStringLiteral("/model/num_layers"), FieldUnit::plain);
  addValue(form, tr("Hidden size"), QStringLiteral("/model/hidden_size"), FieldUnit::plain);
  addValue(form, tr("Attention heads"), QStringLiteral("/model/num_attention_heads"),
           FieldUnit::plain);
  addIntChoice(form, tr("KV heads"), QStringLiteral("/model/num_kv_heads"));
  addValue(form, tr("FFN hidden size"), QStringLiteral("/model/ffn_hidden_size"), FieldUnit::plain);
  addValue(form, tr("Vocabulary"), QStringLiteral("/model/vocab_size"), FieldUnit::plain);
  addChoice(form, tr("MLP"), QStringLiteral("/model/mlp"), enumNames(kMlps));
  addChoice(form, tr("Norm"), QStringLiteral("/model/norm"), enumNames(kNorms));
  addChoice(form, tr("Positions"), QStringLiteral("/model/position_embedding"),
            enumNames(kPositions));
  addValue(form, tr("Max positions"), QStringLiteral("/model/max_position_embeddings"),
           FieldUnit::plain);
  addCheck(form, tr("Tied embeddings"), QStringLiteral("/model/tied_embeddings"));
  addCheck(form, tr("Linear biases"), QStringLiteral("/model/bias"));
  addCheck(form, tr("Embedding norm"), QStringLiteral("/model/embedding_norm"));
}

void ScenarioEditor::buildMoeGroup(QFormLayout* form) {
  // The model's experts (docs/moe.md) and the expert-parallel layout. Empty fields on a dense
  // model write nothing: the document gains /model/moe only when the person types a value.
  const QString moe = QStringLiteral("/model/moe/");
  addValue(form, tr("Experts"), moe + QStringLiteral("num_experts"), FieldUnit::plain);
  addValue(form, tr("Experts per token (top-k)"), moe + QStringLiteral("top_k"), FieldUnit::plain);
  addValue(form, tr("Expert FFN hidden size"), moe + QStringLiteral("expert_ffn_hidden_size"),
           FieldUnit::plain);
  addValue(form, tr("Shared experts"), moe + QStringLiteral("num_shared_experts"),
           FieldUnit::plain);
  addValue(form, tr("Shared expert FFN hidden size"),
           moe + QStringLiteral("shared_expert_ffn_hidden_size"), FieldUnit::plain);
  // Empty = dropless (JSON null), written as an explicit null where the model has experts so that
  // a preset's capacity factor is overridden rather than restored.
  ValueField* capacity = addValue(form, tr("Capacity factor (empty: dropless)"),
                                  moe + QStringLiteral("capacity_factor"), FieldUnit::plain, {},
                                  /*connect=*/false);
  const QString capacityPath = moe + QStringLiteral("capacity_factor");
  connect(capacity, &ValueField::valueEdited, this, [this, capacityPath](const json& value) {
    const bool hasExperts =
        lookup(resolved_, "/model/moe") && lookup(resolved_, "/model/moe")->is_object();
    if (value.is_null() && hasExperts) {
      setDocumentValue(doc_, capacityPath.toStdString(), value, /*keepNull=*/true);
      refresh();
      emit edited();
      return;
    }
    editValue(capacityPath, value);
  });
  QComboBox* router = addChoice(form, tr("Router"), moe + QStringLiteral("router"), {});
  router->addItem(tr("as the preset or default"), QString());
  router->addItem(QStringLiteral("softmax"), QStringLiteral("softmax"));
  router->addItem(QStringLiteral("sigmoid"), QStringLiteral("sigmoid"));
  addCheck(form, tr("Router bias"), moe + QStringLiteral("router_bias"));
  addValue(form, tr("Expert parallel (ep)"), QStringLiteral("/parallel/ep"), FieldUnit::plain);
  addValue(form, tr("Expert tensor parallel (etp)"), QStringLiteral("/parallel/etp"),
           FieldUnit::plain);
}

void ScenarioEditor::buildClusterGroup(QFormLayout* form) {
  addValue(form, tr("GPU memory"), QStringLiteral("/cluster/gpu/memory_bytes"), FieldUnit::giB,
           tr("GiB"));
  addValue(form, tr("Peak bf16"), QStringLiteral("/cluster/gpu/peak_flops/bf16"), FieldUnit::tera,
           tr("TFLOP/s"));
  addValue(form, tr("Peak fp16"), QStringLiteral("/cluster/gpu/peak_flops/fp16"), FieldUnit::tera,
           tr("TFLOP/s"));
  addValue(form, tr("Peak fp32"), QStringLiteral("/cluster/gpu/peak_flops/fp32"), FieldUnit::tera,
           tr("TFLOP/s"));
  addValue(form, tr("HBM bandwidth"), QStringLiteral("/cluster/gpu/memory_bandwidth"),
           FieldUnit::giga, tr("GB/s"));
  addValue(form, tr("Intra-node link"), QStringLiteral("/cluster/intra_node_bandwidth"),
           FieldUnit::giga, tr("GB/s"));
  addValue(form, tr("Inter-node link"), QStringLiteral("/cluster/inter_node_bandwidth"),
           FieldUnit::giga, tr("GB/s"));
  addValue(form, tr("Runtime reserve"), QStringLiteral("/cluster/runtime_reserve_bytes"),
           FieldUnit::giB, tr("GiB"));
}

void ScenarioEditor::buildTrainingGroup(QFormLayout* form) {
  addValue(form, tr("Sequence length"), QStringLiteral("/training/seq_length"), FieldUnit::plain);
  addValue(form, tr("Global batch"), QStringLiteral("/training/global_batch_size"),
           FieldUnit::plain);
  addValue(form, tr("Micro-batch"), QStringLiteral("/training/micro_batch_size"), FieldUnit::plain);
  QStringList precisions = enumNames(kDTypes);
  precisions << QStringLiteral("fp8");  // fp8 GEMMs in bf16 training (docs/memory.md, "FP8")
  addChoice(form, tr("Precision"), QStringLiteral("/training/precision"), precisions);
  addChoice(form, tr("FP8 recipe"), QStringLiteral("/training/fp8_recipe"),
            {QStringLiteral("none"), QStringLiteral("delayed"), QStringLiteral("current"),
             QStringLiteral("blockwise"), QStringLiteral("mxfp8")});
  addChoice(form, tr("Optimizer"), QStringLiteral("/training/optimizer"), enumNames(kOptimizers));
  QComboBox* grad = addChoice(form, tr("Gradient accumulation"), kGradDtypePath, {});
  grad->addItem(tr("same as precision"), QString());
  for (const QString& n : enumNames(kDTypes)) grad->addItem(n, n);
  addChoice(form, tr("Attention"), QStringLiteral("/training/attention"), enumNames(kAttentions));
  addValue(form, tr("Dropout"), QStringLiteral("/training/dropout"), FieldUnit::plain);
  // The memory profile (docs/memory.md): allocated and reserved bytes as the framework measures.
  addChoice(form, tr("Framework"), QStringLiteral("/training/framework"), enumNames(kFrameworks));
}

// training.peft (docs/peft.md): LoRA, QLoRA, or full fine-tuning with frozen parts. The target
// modules (a list of Hugging Face names, or "all-linear") are edited in the file.
void ScenarioEditor::buildPeftGroup(QFormLayout* form) {
  addChoice(form, tr("Method"), QStringLiteral("/training/peft/method"),
            {QStringLiteral("none"), QStringLiteral("full"), QStringLiteral("lora"),
             QStringLiteral("qlora")});
  addValue(form, tr("LoRA rank"), QStringLiteral("/training/peft/rank"), FieldUnit::plain);
  addValue(form, tr("LoRA alpha"), QStringLiteral("/training/peft/alpha"), FieldUnit::plain);
  addValue(form, tr("LoRA dropout"), QStringLiteral("/training/peft/dropout"), FieldUnit::plain);
  addChoice(form, tr("Base weights"), QStringLiteral("/training/peft/base_storage"),
            {QStringLiteral("bf16"), QStringLiteral("fp16"), QStringLiteral("fp32"),
             QStringLiteral("nf4"), QStringLiteral("fp4"), QStringLiteral("int8")});
  addCheck(form, tr("Double quantization"), QStringLiteral("/training/peft/double_quant"));
  addChoice(form, tr("Adapter dtype"), QStringLiteral("/training/peft/adapter_dtype"),
            enumNames(kDTypes));
  addValue(form, tr("Frozen layers"), QStringLiteral("/training/peft/frozen_layers"),
           FieldUnit::plain);
  addCheck(form, tr("Freeze embeddings"), QStringLiteral("/training/peft/freeze_embeddings"));
  addCheck(form, tr("Paged optimizer"), QStringLiteral("/training/peft/paged_optimizer"));
}

void ScenarioEditor::buildParallelGroup(QFormLayout* form) {
  addIntChoice(form, tr("Tensor parallel"), QStringLiteral("/parallel/tp"));
  addIntChoice(form, tr("Pipeline parallel"), QStringLiteral("/parallel/pp"));
  addValue(form, tr("Context parallel"), QStringLiteral("/parallel/cp"), FieldUnit::plain);
  addChoice(form, tr("CP exchange"), QStringLiteral("/parallel/cp_comm"),
            {QStringLiteral("p2p"), QStringLiteral("all_gather"), QStringLiteral("a2a")});
  addIntChoice(form, tr("Data parallel"), kDpPath);
  addIntChoice(form, tr("ZeRO stage"), QStringLiteral("/parallel/zero_stage"));
  addValue(form, tr("ZeRO shard group"), QStringLiteral("/parallel/fsdp_shard_size"),
           FieldUnit::plain);
  addCheck(form, tr("Sequence parallel"), QStringLiteral("/parallel/sequence_parallel"));
  addChoice(form, tr("Recompute"), QStringLiteral("/parallel/recompute"), enumNames(kRecomputes));
  addChoice(form, tr("Schedule"), QStringLiteral("/parallel/schedule"), enumNames(kSchedules));
  addValue(form, tr("Virtual stages"), QStringLiteral("/parallel/virtual_stages"),
           FieldUnit::plain);
  const QStringList offload = {QStringLiteral("none"), QStringLiteral("cpu"),
                               QStringLiteral("nvme")};
  addChoice(form, tr("Offload optimizer"), QStringLiteral("/parallel/offload_optimizer"), offload);
  addChoice(form, tr("Offload parameters"), QStringLiteral("/parallel/offload_params"), offload);
}

void ScenarioEditor::buildAssumptionsGroup(QFormLayout* form) {
  addValue(form, tr("Compute efficiency"), QStringLiteral("/assumptions/compute_efficiency"),
           FieldUnit::plain);
  addValue(form, tr("Communication efficiency"),
           QStringLiteral("/assumptions/communication_efficiency"), FieldUnit::plain);
}

void ScenarioEditor::setDocument(const json& doc) {
  doc_ = doc;
  resolved_ = nullptr;
  resolvedScenario_.reset();
  refresh();
  clearError();
}

void ScenarioEditor::setResolved(const Scenario& s, bool withLayout) {
  resolvedScenario_ = s;
  resolved_ = to_json(s);
  if (!withLayout) {
    resolved_.erase("parallel");
    resolved_["training"].erase("micro_batch_size");
  }
  refresh();
}

void ScenarioEditor::editValue(const QString& path, const json& value) {
  setDocumentValue(doc_, path.toStdString(), value);
  refresh();
  emit edited();
}

void ScenarioEditor::editValues(const std::vector<std::pair<QString, json>>& values) {
  for (const auto& [path, value] : values) setDocumentValue(doc_, path.toStdString(), value);
  refresh();
  emit edited();
}

void ScenarioEditor::applyScenario(const Scenario& from, const Scenario& to) {
  const json before = to_json(from);
  const json after = to_json(to);
  for (const json& op : json::diff(before, after)) {
    // A change inside a list replaces the whole list.
    std::string path;
    const json* node = &after;
    for (const std::string& t : pointerTokens(op.at("path").get<std::string>())) {
      if (!node || !node->is_object()) break;
      path += "/" + t;
      const auto it = node->find(t);
      node = it == node->end() ? nullptr : &*it;
    }
    setDocumentValue(doc_, path, node ? *node : json(nullptr));
  }
  refresh();
  emit edited();
}

void ScenarioEditor::presetChosen(const QString& path, const QString& name, bool model) {
  // The preset already shown: its overrides stay (the combo box re-emits activated for it).
  if (const json* current = lookup(doc_, path.toStdString());
      !name.isEmpty() && current && presetOf(*current) == name)
    return;
  if (!name.isEmpty()) {
    editValue(path, json(name.toStdString()));
    return;
  }
  // "custom": the resolved values become the document's own, no longer tied to a preset.
  const json* resolved = lookup(resolved_, path.toStdString());
  if (!resolved || !resolved->is_object()) return;
  json custom = *resolved;
  if (model) custom["name"] = resolved->value("name", std::string("custom"));
  editValue(path, custom);
}

json ScenarioEditor::shownValue(const QString& path, bool* inDocument) const {
  const std::string p = path.toStdString();
  if (const json* v = lookup(doc_, p)) {
    *inDocument = true;
    return *v;
  }
  *inDocument = false;
  if (path == kDpPath || path == kGradDtypePath) return nullptr;  // derived: shown as such
  // ep and etp are left out of the resolved JSON at their default; the scenario holds them (not
  // shown when the layout is a search request's placeholder).
  const bool layout = resolvedScenario_ && resolved_.contains("parallel");
  if (layout && path == QStringLiteral("/parallel/ep")) return resolvedScenario_->parallel.ep;
  if (layout && path == QStringLiteral("/parallel/etp")) return resolvedScenario_->parallel.etp;
  if (const json* v = lookup(resolved_, p)) return *v;
  return nullptr;
}

void ScenarioEditor::refresh() {
  const bool was = updating_;
  updating_ = true;
  for (auto it = fields_.cbegin(); it != fields_.cend(); ++it) refreshField(it.key(), it.value());
  refreshOtherFields();
  updating_ = was;
}

void ScenarioEditor::refreshField(const QString& path, const Field& f) {
  bool inDocument = false;
  const json value = shownValue(path, &inDocument);
  switch (f.kind) {
    case Kind::value:
      static_cast<ValueField*>(f.editor)->showValue(value, inDocument);
      return;
    case Kind::check: {
      auto* box = static_cast<QCheckBox*>(f.editor);
      const QSignalBlocker block(box);
      box->setChecked(value.is_boolean() && value.get<bool>());
      setItalic(box, !inDocument);
      return;
    }
    case Kind::choice: {
      auto* box = static_cast<QComboBox*>(f.editor);
      const QSignalBlocker block(box);
      // Drop an earlier "as in the file" item: it named a value the document may no longer hold.
      for (int i = box->count() - 1; i >= 0; --i) {
        if (!box->itemData(i).isValid()) box->removeItem(i);
      }
      if (value.is_string()) {
        const QString text = QString::fromStdString(value.get<std::string>());
        const int index = box->findData(text);
        if (index >= 0) {
          box->setCurrentIndex(index);
        } else {
          selectOrAdd(box, QVariant(), tr("%1 (as in the file)").arg(text));
        }
      } else if (value.is_null()) {
        box->setCurrentIndex(std::max(0, box->findData(QString())));
      } else {
        selectOrAdd(box, QVariant(), shortDump(value));
      }
      setItalic(box, !inDocument);
      return;
    }
    case Kind::preset: {
      auto* box = static_cast<QComboBox*>(f.editor);
      const QSignalBlocker block(box);
      for (int i = box->count() - 1; i >= 0; --i) {
        if (!box->itemData(i).isValid()) box->removeItem(i);
      }
      const QString preset = presetOf(value);
      const int index = box->findData(preset);
      if (preset.isEmpty()) {
        box->setCurrentIndex(box->findData(QString()));
      } else if (index >= 0) {
        box->setCurrentIndex(index);
      } else {
        selectOrAdd(box, QVariant(), tr("%1 (as in the file)").arg(preset));
      }
      return;
    }
    case Kind::intChoice:
      break;
  }

  // Integer choices: the values the layout admits, from the resolved scenario.
  auto* box = static_cast<QComboBox*>(f.editor);
  const QSignalBlocker block(box);
  box->clear();
  std::vector<Count> offered;
  const Scenario* s = resolvedScenario_ ? &*resolvedScenario_ : nullptr;
  if (path == QStringLiteral("/parallel/zero_stage")) {
    offered = {0, 1, 2, 3};
  } else if (s && path == QStringLiteral("/model/num_kv_heads")) {
    offered = divisors(s->model.num_attention_heads);
  } else if (s && path == QStringLiteral("/parallel/tp")) {
    // tp must split the query heads, the KV heads and the FFN width (Megatron-LM's rules).
    const Count g = std::gcd(std::gcd(s->model.num_attention_heads, s->model.num_kv_heads),
                             std::gcd(s->model.ffn_hidden_size, s->cluster.num_gpus));
    offered = divisors(g);
  } else if (s && path == QStringLiteral("/parallel/pp")) {
    for (Count p : divisors(s->model.num_layers)) {
      if (s->cluster.num_gpus % (s->parallel.tp * s->parallel.cp * p) == 0) offered.push_back(p);
    }
  } else if (s && path == kDpPath) {
    const Count derived = s->cluster.num_gpus / (s->parallel.tp * s->parallel.cp * s->parallel.pp);
    box->addItem(tr("auto (%1)").arg(derived), QVariant::fromValue<qlonglong>(-1));
    offered = {derived};
  }
  if (path == kDpPath && !s) box->addItem(tr("auto"), QVariant::fromValue<qlonglong>(-1));
  for (Count v : offered) box->addItem(QString::number(v), QVariant::fromValue<qlonglong>(v));
  if (value.is_null()) {
    box->setCurrentIndex(box->findData(QVariant::fromValue<qlonglong>(-1)));
  } else if (value.is_number_integer()) {
    const auto v = value.get<qlonglong>();
    selectOrAdd(box, QVariant::fromValue<qlonglong>(v), tr("%1 (not offered)").arg(v));
  } else {
    selectOrAdd(box, QVariant(), tr("%1 (as in the file)").arg(shortDump(value)));
  }
  setItalic(box, !inDocument);
}

void ScenarioEditor::refreshOtherFields() {
  // Sections the editor's widgets cover; anything else is listed whole.
  static const QSet<QString> sections = {QString(),
                                         QStringLiteral("/model"),
                                         QStringLiteral("/model/moe"),
                                         QStringLiteral("/cluster"),
                                         QStringLiteral("/cluster/gpu"),
                                         QStringLiteral("/cluster/gpu/peak_flops"),
                                         QStringLiteral("/training"),
                                         QStringLiteral("/parallel"),
                                         QStringLiteral("/assumptions")};
  static const QSet<QString> presetKeys = {QStringLiteral("/model/preset"),
                                           QStringLiteral("/cluster/gpu/preset")};
  QStringList lines;
  auto walk = [&](auto&& self, const json& node, const QString& path) -> void {
    if (node.is_object() && sections.contains(path)) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        QString key = QString::fromStdString(it.key());
        key.replace(QLatin1Char('~'), QStringLiteral("~0"))
            .replace(QLatin1Char('/'), QStringLiteral("~1"));
        self(self, it.value(), path + QLatin1Char('/') + key);
      }
      return;
    }
    if (fields_.contains(path) || presetKeys.contains(path)) return;
    lines << tr("%1: %2").arg(path, shortDump(node));
  };
  walk(walk, doc_, QString());
  otherFields_->setText(lines.join(QLatin1Char('\n')));
  otherBox_->setVisible(!lines.isEmpty());
}

QString ScenarioEditor::otherFieldsText() const {
  return otherFields_->text();
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
