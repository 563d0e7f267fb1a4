// The Mixture-of-Experts fields of the scenario editor (issue 12 item 10): a Mixtral scenario
// shows the preset's published expert shape, an edit of ep writes that one value, and the plan's
// expert all-to-alls and expert-gradient group appear in the communication view. A dense file
// opened and left alone stays byte for byte the same.
#include <QCheckBox>
#include <QComboBox>
#include <QFile>
#include <QLineEdit>
#include <QTemporaryDir>
#include <QtTest>
#include <nlohmann/json.hpp>

#include "communicationmodel.h"
#include "communicationview.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "guitestutil.h"
#include "mainwindow.h"
#include "plansession.h"
#include "scenarioeditor.h"
#include "timelineview.h"
#include "timelinewidget.h"

using namespace distplan;
using namespace distplan::gui;
using namespace distplan::gui::test;
using nlohmann::json;

namespace {

// Mixtral-8x7B on 32 H100s, dp = 32 with the experts over ep ranks (tests/planner/moe_plan_test).
json mixtralDoc(int ep) {
  return {{"model", "mixtral-8x7b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 32}, {"gpus_per_node", 8}}},
          {"training",
           {{"seq_length", 4096},
            {"global_batch_size", 32},
            {"micro_batch_size", 1},
            {"precision", "bf16"},
            {"optimizer", "adam"}}},
          {"parallel", {{"tp", 1}, {"pp", 1}, {"dp", 32}, {"ep", ep}, {"zero_stage", 1}}}};
}

QString fieldText(MainWindow& w, const char* path) {
  auto* f = w.editor()->findChild<QLineEdit*>(QString::fromLatin1(path));
  return f ? f->text() : QStringLiteral("<no field>");
}

bool openDoc(MainWindow& w, QTemporaryDir& dir, const json& doc) {
  const QString path = dir.filePath(QStringLiteral("scenario.json"));
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly)) return false;
  f.write(QByteArray::fromStdString(doc.dump(2)));
  f.close();
  QString error;
  if (!w.openScenario(path, &error)) return false;
  return w.session()->waitForPlan();
}

}  // namespace

class MoeEditorTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void mixtralFieldsShowThePresetAndEpEditReachesTheCommunicationView() {
    QTemporaryDir dir;
    MainWindow w(false);
    const json original = mixtralDoc(4);
    QVERIFY(openDoc(w, dir, original));
    QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
    // Mixtral 8x7B's config.json (Jiang et al. 2024, Table 1; data/models/mixtral-8x7b.json):
    // 8 experts, 2 per token, expert FFN 14336, no shared expert, softmax router, dropless.
    QCOMPARE(fieldText(w, "/model/moe/num_experts"), QStringLiteral("8"));
    QCOMPARE(fieldText(w, "/model/moe/top_k"), QStringLiteral("2"));
    QCOMPARE(fieldText(w, "/model/moe/expert_ffn_hidden_size"), QStringLiteral("14336"));
    QCOMPARE(fieldText(w, "/model/moe/num_shared_experts"), QStringLiteral("0"));
    QCOMPARE(fieldText(w, "/model/moe/capacity_factor"), QString());
    auto* router = w.editor()->findChild<QComboBox*>(QStringLiteral("/model/moe/router"));
    QVERIFY(router);
    QCOMPARE(router->currentData().toString(), QStringLiteral("softmax"));
    QCOMPARE(fieldText(w, "/parallel/ep"), QStringLiteral("4"));
    QCOMPARE(fieldText(w, "/parallel/etp"), QStringLiteral("1"));
    // Showing the values wrote nothing.
    QCOMPARE(w.editor()->document(), original);

    QVERIFY(typeText(w, "/parallel/ep", QStringLiteral("8")));
    QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
    json expected = original;
    expected["parallel"]["ep"] = 8;
    QCOMPARE(w.editor()->document(), expected);  // the one value typed, nothing else
    QCOMPARE(w.session()->scenario().parallel.ep, Count{8});

    // The communication view lists the planner's collectives for the edited document.
    const Estimate e = sim::plan(scenario_from_json(w.editor()->document()));
    CommunicationModel* model = w.communicationView()->model();
    QCOMPARE(model->rowCount(), static_cast<int>(e.communication.collectives.size()));
    QStringList epWhats;
    int edpRows = 0;
    for (int i = 0; i < model->rowCount(); ++i) {
      const QString group =
          model->data(model->index(i, CommunicationModel::GroupColumn)).toString();
      const qlonglong ranks =
          model->data(model->index(i, CommunicationModel::GroupSizeColumn)).toLongLong();
      if (group == QStringLiteral("ep")) {
        QCOMPARE(model->data(model->index(i, CommunicationModel::OpColumn)).toString(),
                 QStringLiteral("all_to_all"));
        QCOMPARE(ranks, 8LL);  // the ep typed
        epWhats << model->data(model->index(i, CommunicationModel::WhatColumn)).toString();
      } else if (group == QStringLiteral("edp")) {
        ++edpRows;
        QCOMPARE(ranks, 4LL);  // expert data parallel: 32 GPUs / (tp 1 · ep 8) = 4
      }
    }
    epWhats.sort();
    QCOMPARE(
        epWhats,
        QStringList({QStringLiteral("combine (backward)"), QStringLiteral("combine (forward)"),
                     QStringLiteral("dispatch (backward)"), QStringLiteral("dispatch (forward)")}));
    QVERIFY(edpRows > 0);

    // The timeline shows the all-to-all share the planner put inside each stage's passes.
    if (!PlanSession::simulatorAvailable()) QSKIP("built without the simulator");
    w.session()->simulateNow();
    QVERIFY(w.session()->hasSimulation());
    TimelineWidget* t = w.timelineView()->timeline();
    QCOMPARE(t->timeline().moe_all_to_all_seconds.size(), e.stage_costs.size());
    for (std::size_t i = 0; i < e.stage_costs.size(); ++i) {
      QVERIFY(e.stage_costs[i].ep_communication > 0);
      QCOMPARE(t->timeline().moe_all_to_all_seconds[i], e.stage_costs[i].ep_communication);
    }
    const QString ms = QString::number(e.stage_costs[0].ep_communication * 1e3, 'f', 3);
    QVERIFY2(w.timelineView()->infoText().contains(QStringLiteral("MoE all-to-all ") + ms),
             qPrintable(w.timelineView()->infoText()));
    bool sawForward = false;
    for (const TimelineBlock& b : t->timeline().blocks) {
      if (b.kind != BlockKind::forward) continue;
      sawForward = true;
      QVERIFY(t->blockDescription(b).contains(ms + QStringLiteral(" ms per micro-batch")));
      break;
    }
    QVERIFY(sawForward);
  }

  void capacityFactorClearedIsDroplessNull() {
    QTemporaryDir dir;
    MainWindow w(false);
    QVERIFY(openDoc(w, dir, mixtralDoc(8)));
    QVERIFY(typeText(w, "/model/moe/capacity_factor", QStringLiteral("1.25")));
    QCOMPARE(w.editor()->document()["model"]["moe"]["capacity_factor"], json(1.25));
    QCOMPARE(w.editor()->document()["model"]["preset"], json("mixtral-8x7b"));
    QVERIFY(w.session()->scenario().model.moe.capacity_factor.has_value());
    QCOMPARE(*w.session()->scenario().model.moe.capacity_factor, 1.25);
    // Cleared: an explicit null (dropless), not the key removed.
    QVERIFY(typeText(w, "/model/moe/capacity_factor", QString()));
    const json& moe = w.editor()->document()["model"]["moe"];
    QVERIFY(moe.contains("capacity_factor") && moe["capacity_factor"].is_null());
    QVERIFY(w.session()->isValid());
    QVERIFY(!w.session()->scenario().model.moe.capacity_factor.has_value());
  }

  void denseScenarioShowsEmptyMoeFieldsAndStaysUnchanged() {
    MainWindow w(false);
    loadDefault(w);
    const json before = w.editor()->document();
    QCOMPARE(fieldText(w, "/model/moe/num_experts"), QString());
    QCOMPARE(fieldText(w, "/model/moe/top_k"), QString());
    QCOMPARE(fieldText(w, "/parallel/ep"), QStringLiteral("1"));
    auto* router = w.editor()->findChild<QComboBox*>(QStringLiteral("/model/moe/router"));
    QVERIFY(router);
    QCOMPARE(router->currentData().toString(), QString());
    // Entering and leaving every MoE field without typing writes nothing.
    for (const char* path : {"/model/moe/num_experts", "/model/moe/capacity_factor", "/parallel/ep",
                             "/parallel/etp"}) {
      auto* f = w.editor()->findChild<QLineEdit*>(QString::fromLatin1(path));
      QVERIFY(f);
      emit f->editingFinished();
    }
    QCOMPARE(w.editor()->document(), before);
    if (PlanSession::simulatorAvailable()) w.session()->simulateNow();
    QVERIFY(w.timelineView()->timeline()->timeline().moe_all_to_all_seconds.empty());
    QVERIFY(!w.timelineView()->infoText().contains(QStringLiteral("MoE")));
    QVERIFY(!w.editor()->document()["model"].is_object() ||
            !w.editor()->document()["model"].contains("moe"));
  }
};

QTEST_MAIN(MoeEditorTest)
#include "moe_test.moc"
