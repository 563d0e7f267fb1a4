// The scenario editor drives the plan: every edit recomputes it, the memory chart shows exactly
// the planner's figures for the edited document, and invalid input shows the validator's message.
#include <QComboBox>
#include <QFile>
#include <QLabel>
#include <QLineEdit>
#include <QScrollArea>
#include <QTemporaryDir>
#include <QtTest>
#include <nlohmann/json.hpp>

#include "categories.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "guitestutil.h"
#include "mainwindow.h"
#include "memorymodel.h"
#include "memoryview.h"
#include "plansession.h"
#include "scenarioeditor.h"

using namespace distplan;
using namespace distplan::gui;
using namespace distplan::gui::test;

class EditorTest : public QObject {
  Q_OBJECT

 private:
  /// The memory view against an estimate computed here from the editor's document.
  static void expectMemoryMatchesPlanner(MainWindow& w) {
    const Scenario s = scenario_from_json(w.editor()->document());
    const Estimate e = sim::plan(s);
    MemoryView* view = w.memoryView();
    QCOMPARE(view->barCount(), static_cast<int>(e.memory.stages.size()));
    QCOMPARE(view->model()->rowCount(), static_cast<int>(e.memory.stages.size()));
    for (int i = 0; i < static_cast<int>(e.memory.stages.size()); ++i) {
      const StageMemory& stage = e.memory.stages[static_cast<std::size_t>(i)];
      for (std::size_t c = 0; c < kMemoryCategories.size(); ++c) {
        const Bytes bytes = categoryBytes(stage, kMemoryCategories[c]);
        QCOMPARE(view->barValueGiB(kMemoryCategories[c], i), to_gib(bytes));
        const QModelIndex cell =
            view->model()->index(i, MemoryModel::FirstCategoryColumn + static_cast<int>(c));
        QCOMPARE(view->model()->data(cell, Qt::UserRole).toLongLong(), bytes);
      }
      const QModelIndex total = view->model()->index(i, MemoryModel::TotalColumn);
      QCOMPARE(view->model()->data(total, Qt::UserRole).toLongLong(), stage.total_bytes);
    }
    QCOMPARE(view->capacityLineGiB(), to_gib(e.memory.capacity_bytes));
  }

 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  // At 1440 × 900 (the screenshot size) every layout field is in view without scrolling, and no
  // field of the editor is narrower than the text it shows.
  void layoutIsInViewAndFieldsAreReadableAt1440x900() {
    MainWindow w(false);
    loadDefault(w);
    w.resize(1440, 900);
    w.show();
    QCoreApplication::processEvents();
    auto* scroll = w.findChild<QScrollArea*>();
    QVERIFY(scroll != nullptr);
    const QRect view = scroll->viewport()->rect();
    for (const char* path :
         {"/model", "/cluster/gpu", "/cluster/num_gpus", "/parallel/tp", "/parallel/pp",
          "/parallel/cp", "/parallel/dp", "/parallel/zero_stage", "/parallel/sequence_parallel",
          "/parallel/recompute", "/parallel/schedule", "/parallel/virtual_stages"}) {
      auto* field = w.editor()->findChild<QWidget*>(QString::fromLatin1(path));
      QVERIFY2(field != nullptr, path);
      const QRect at(field->mapTo(scroll->viewport(), QPoint(0, 0)), field->size());
      QVERIFY2(view.contains(at), qPrintable(QStringLiteral("%1 at y %2, view %3 high")
                                                 .arg(QString::fromLatin1(path))
                                                 .arg(at.bottom())
                                                 .arg(view.height())));
    }
    for (QLineEdit* edit : w.editor()->findChildren<QLineEdit*>()) {
      if (!edit->isVisible() || qobject_cast<QComboBox*>(edit->parent())) continue;
      const int text = edit->fontMetrics().horizontalAdvance(edit->text());
      QVERIFY2(text + 8 <= edit->width(), qPrintable(QStringLiteral("%1: '%2' in %3 px")
                                                         .arg(edit->objectName(), edit->text())
                                                         .arg(edit->width())));
    }
    for (QComboBox* box : w.editor()->findChildren<QComboBox*>()) {
      if (!box->isVisible()) continue;
      const int text = box->fontMetrics().horizontalAdvance(box->currentText());
      QVERIFY2(text + 24 <= box->width(), qPrintable(QStringLiteral("%1: '%2' in %3 px")
                                                         .arg(box->objectName(), box->currentText())
                                                         .arg(box->width())));
    }
  }

  void defaultScenarioIsLlama70bOn64H100() {
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->scenario(), scenario_from_json(parse_json_text(default_scenario_text())));
    expectMemoryMatchesPlanner(w);
  }

  void tensorParallelChangeSetsMemoryChartToPlannerFigures() {
    MainWindow w(false);
    loadDefault(w);
    const double weightsBefore = w.memoryView()->barValueGiB(MemoryCategory::weights, 0);
    const Count tp = w.session()->scenario().parallel.tp;
    // The default file pins dp = 2; "auto" removes it, so dp follows tp (the file is not changed
    // behind the person's back).
    QVERIFY(chooseInt(w, "/parallel/dp", -1));
    QVERIFY(chooseInt(w, "/parallel/tp", tp / 2));
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->scenario().parallel.tp, tp / 2);
    // Half the tensor-parallel ranks: each holds a larger weight shard.
    QVERIFY(w.memoryView()->barValueGiB(MemoryCategory::weights, 0) > weightsBefore);
    expectMemoryMatchesPlanner(w);
  }

  void zeroStageChangeSetsMemoryChartToPlannerFigures() {
    MainWindow w(false);
    loadDefault(w);
    for (int stage : {0, 1, 2, 3}) {
      QVERIFY(chooseInt(w, "/parallel/zero_stage", stage));
      QVERIFY(w.session()->isValid());
      QCOMPARE(w.session()->scenario().parallel.zero_stage, stage);
      expectMemoryMatchesPlanner(w);
    }
  }

  // Fine-tuning (docs/peft.md): the editor's method and frozen layers reach the plan, and the
  // memory chart draws the frozen weights apart from what trains.
  void fineTuningFieldsSplitTheWeightsIntoFrozenAndTrained() {
    MainWindow w(false);
    loadDefault(w);
    QCOMPARE(w.memoryView()->frozenWeightsGiB(0), -1.0);  // pre-training: nothing frozen
    // Megatron-LM, the default, fine-tunes nothing (docs/frameworks.md): the textbook model.
    QVERIFY(chooseText(w, "/training/framework", QStringLiteral("generic")));
    QVERIFY(chooseText(w, "/training/peft/method", QStringLiteral("full")));
    QVERIFY(setCount(w, "/training/peft/frozen_layers", 20));
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->scenario().training.peft.method, PeftMethod::full);
    QCOMPARE(w.session()->scenario().training.peft.frozen_layers, Count{20});
    const Estimate e = estimate(scenario_from_json(w.editor()->document()));
    // Stage 0 holds layers 0-19: all frozen, with the embedding (which trains).
    const StageMemory& s0 = e.memory.stages.front();
    QVERIFY(s0.frozen_weights_bytes > 0);
    QCOMPARE(w.memoryView()->frozenWeightsGiB(0), to_gib(s0.frozen_weights_bytes));
    QCOMPARE(w.memoryView()->frozenWeightsGiB(1), 0.0);
    expectMemoryMatchesPlanner(w);
    // LoRA adapters under tensor parallelism are refused at /parallel/tp.
    QVERIFY(chooseText(w, "/training/peft/method", QStringLiteral("lora")));
    QVERIFY(!w.session()->isValid());
    QVERIFY(w.editor()->errorText().contains(QStringLiteral("/parallel/tp")));
  }

  void tensorParallelOffersOnlyValidDivisors() {
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(chooseInt(w, "/parallel/dp", -1));  // dp derived, not pinned by the file
    const ModelSpec& m = w.session()->scenario().model;
    auto* box = w.editor()->findChild<QComboBox*>(QStringLiteral("/parallel/tp"));
    QVERIFY(box && box->count() > 1);
    for (int i = 0; i < box->count(); ++i) {
      const qlonglong tp = box->itemData(i).toLongLong();
      QCOMPARE(m.num_attention_heads % tp, 0);
      QCOMPARE(m.num_kv_heads % tp, 0);
      // Every offered value is accepted by the validator.
      box->setCurrentIndex(i);
      emit box->activated(i);
      QVERIFY(w.session()->waitForPlan());
      QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
    }
  }

  void invalidInputShowsValidatorMessageBesideTheField() {
    MainWindow w(false);
    loadDefault(w);
    const Estimate before = w.session()->estimate();
    QVERIFY(setCount(w, "/cluster/num_gpus", 60));  // 60 is not a multiple of tp*pp = 32
    QVERIFY(!w.session()->isValid());
    QString path, message;
    try {
      (void)scenario_from_json(w.editor()->document());
      QFAIL("the validator accepted 60 GPUs for tp*pp = 32");
    } catch (const InputError& e) {
      path = QString::fromStdString(e.path());
      message = QString::fromUtf8(e.what());
    }
    QVERIFY(!message.isEmpty());
    QVERIFY(w.editor()->errorText().contains(message));
    QVERIFY(w.editor()->errorText().contains(path));
    QVERIFY(w.bannerText().contains(message));
    // The label beside the field the path names is the one that shows it.
    auto* label = w.editor()->findChild<QLabel*>(QStringLiteral("error:") + path);
    if (!label) label = w.editor()->findChild<QLabel*>(QStringLiteral("error:"));
    QVERIFY(label);
    QVERIFY(!label->isHidden());
    QVERIFY(label->text().contains(message));
    // The last valid plan stays on screen; fixing the field clears the message.
    QCOMPARE(w.session()->estimate(), before);
    QVERIFY(setCount(w, "/cluster/num_gpus", 64));
    QVERIFY(w.session()->isValid());
    QVERIFY(w.editor()->errorText().isEmpty());
    QVERIFY(w.bannerText().isEmpty());
  }

  void modelPresetFillsThePresetFields() {
    MainWindow w(false);
    loadDefault(w);
    auto* box = w.editor()->findChild<QComboBox*>(QStringLiteral("/model"));
    QVERIFY(box);
    const int index = box->findData(QStringLiteral("llama2-7b"));
    QVERIFY(index >= 0);
    box->setCurrentIndex(index);
    emit box->activated(index);
    QVERIFY(w.session()->waitForPlan());
    const nlohmann::json doc = w.editor()->document();
    QCOMPARE(QString::fromStdString(doc["model"].get<std::string>()), QStringLiteral("llama2-7b"));
    const std::optional<ModelSpec> preset = find_model_preset("llama2-7b");
    QVERIFY(preset.has_value());
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->scenario().model, *preset);
    expectMemoryMatchesPlanner(w);
  }

  // Picking the preset already shown again keeps the model's overrides (issue 29, item 15: the
  // document's {"preset": ..., overrides} became the bare preset name).
  void samePresetPickedAgainKeepsTheOverrides() {
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(setCount(w, "/model/num_layers", 40));
    QCOMPARE(w.session()->scenario().model.num_layers, 40);
    auto* box = w.editor()->findChild<QComboBox*>(QStringLiteral("/model"));
    QVERIFY(box);
    const int index = box->findData(QStringLiteral("llama2-70b"));
    QVERIFY(index >= 0);
    box->setCurrentIndex(index);
    emit box->activated(index);
    QVERIFY(w.session()->waitForPlan());
    QCOMPARE(w.session()->scenario().model.num_layers, 40);
    const nlohmann::json doc = w.editor()->document();
    QCOMPARE(doc["model"].value("num_layers", 0), 40);
    // Another preset replaces the model, overrides and all.
    const int other = box->findData(QStringLiteral("llama2-7b"));
    box->setCurrentIndex(other);
    emit box->activated(other);
    QVERIFY(w.session()->waitForPlan());
    QCOMPARE(w.session()->scenario().model, *find_model_preset("llama2-7b"));
  }

  void saveThenOpenGivesTheSameScenario() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("scenario.json"));
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(setCount(w, "/training/global_batch_size", 256));
    const Scenario edited = w.session()->scenario();
    QString error;
    QVERIFY2(w.saveScenario(path, &error), qPrintable(error));
    QVERIFY(QFile::exists(path));

    MainWindow other(false);
    QVERIFY2(other.openScenario(path, &error), qPrintable(error));
    QVERIFY(other.session()->waitForPlan());
    QVERIFY(other.session()->isValid());
    QCOMPARE(other.session()->scenario(), edited);
  }

  void openingAnInvalidFileReportsItsPath() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("bad.json"));
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"model": "llama2-7b", "cluster": {"gpu": "a100-80gb", "num_gpus": 8},
               "training": {"seq_length": 2048, "global_batch_size": 64},
               "parallel": {"tp": 3}})");
    f.close();
    MainWindow w(false);
    QString error;
    QVERIFY(!w.openScenario(path, &error));
    QVERIFY2(error.contains(QStringLiteral("/parallel")), qPrintable(error));
  }
};

QTEST_MAIN(EditorTest)
#include "editor_test.moc"
