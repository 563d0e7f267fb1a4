// The validation tab on real `distplan validate` output: the checked-in result of tiny-gpt
// tp2·pp2·dp2 on the CPU (data/validation/tiny-gpt-tp2-pp2-dp2.result.json) loads, and every bar
// and error cell equals the JSON's figure in the unit shown; a malformed or stale file shows the
// library's error at its JSON path; the communication chart switches to a log axis; the CLI
// is found beside the GUI's build; and a CPU run started from the view (8 ranks under mpirun)
// streams its log and shows its result.
#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QLogValueAxis>
#include <QProcess>
#include <QSignalSpy>
#include <QSpinBox>
#include <QStackedBarSeries>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QValueAxis>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "validationview.h"

using distplan::gui::ValidationView;
using nlohmann::json;

namespace {

const QString kFixture =
    QStringLiteral(DISTPLAN_SOURCE_DIR "/data/validation/tiny-gpt-tp2-pp2-dp2.result.json");
const QString kScenario =
    QStringLiteral(DISTPLAN_SOURCE_DIR "/data/validation/tiny-gpt-tp2-pp2-dp2.json");

QByteArray readAll(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

// The memory chart stacks the planner's categories less the runtime reserve, then temporaries.
const char* const kSegments[] = {"weights_bytes",     "gradients_bytes", "optimizer_bytes",
                                 "activations_bytes", "buffers_bytes",   "temporaries_bytes"};

double bytes(const json& stage, const char* key) {
  return stage.contains(key) ? stage[key].get<double>() : 0.0;
}

/// Bytes per step by "S<stage> <group> <op>", summed over a side's collectives.
std::map<QString, double> commByLabel(const json& stages) {
  std::map<QString, double> out;
  for (const json& st : stages) {
    for (const json& c : st["collectives"]) {
      out[QStringLiteral("S%1 %2 %3")
              .arg(st["stage"].get<int>())
              .arg(QString::fromStdString(c["group"].get<std::string>()),
                   QString::fromStdString(c["op"].get<std::string>()))] +=
          c["bytes_per_step"].get<double>();
    }
  }
  return out;
}

/// The figures of an error object: numbers and nulls, less each per-stage entry's "stage".
std::size_t leaves(const json& node) {
  if (node.is_number() || node.is_null()) return 1;
  std::size_t n = 0;
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it)
      if (it.key() != "stage") n += leaves(it.value());
  } else if (node.is_array()) {
    for (const json& child : node) n += leaves(child);
  }
  return n;
}

/// The processes whose parent is `parent` (Linux /proc).
std::vector<qint64> childrenOf(qint64 parent) {
  std::vector<qint64> out;
  for (const QString& entry : QDir(QStringLiteral("/proc")).entryList(QDir::Dirs)) {
    bool numeric = false;
    const qint64 pid = entry.toLongLong(&numeric);
    if (!numeric) continue;
    QFile stat(QStringLiteral("/proc/%1/stat").arg(entry));
    if (!stat.open(QIODevice::ReadOnly)) continue;
    const QByteArray line = stat.readAll();
    const QList<QByteArray> fields = line.mid(line.lastIndexOf(')') + 2).split(' ');
    // A zombie waits for its parent to reap it: it runs no more.
    if (fields.size() > 1 && fields[1].toLongLong() == parent && fields[0] != "Z")
      out.push_back(pid);
  }
  return out;
}

bool alive(qint64 pid) {
  QFile stat(QStringLiteral("/proc/%1/stat").arg(pid));
  if (!stat.open(QIODevice::ReadOnly)) return false;
  const QByteArray line = stat.readAll();
  return !line.mid(line.lastIndexOf(')') + 2).startsWith("Z");
}

}  // namespace

class ValidationTest : public QObject {
  Q_OBJECT

 private slots:
  void fixtureBarsEqualTheResultsBytes() {
    const QByteArray text = readAll(kFixture);
    QVERIFY(!text.isEmpty());
    const json doc = json::parse(text.toStdString());
    QCOMPARE(doc["schema"].get<std::string>(), std::string("distplan.validate/v1"));
    ValidationView view;
    QSignalSpy loaded(&view, &ValidationView::resultLoaded);
    QVERIFY(view.openFile(kFixture));
    QCOMPARE(loaded.count(), 1);

    // Memory: a tiny model is drawn in MiB, two bars (predicted, measured) per measured stage.
    QCOMPARE(view.memoryUnitBytes(), 1024.0 * 1024.0);
    auto* series = qobject_cast<QStackedBarSeries*>(view.chartView()->chart()->series().value(0));
    QVERIFY(series);
    const json& pst = doc["predicted"]["memory"]["stages"];
    const json& mst = doc["measured"]["memory"]["stages"];
    QCOMPARE(mst.size(), std::size_t{2});
    QCOMPARE(series->barSets().size(), static_cast<qsizetype>(std::size(kSegments)));
    for (std::size_t k = 0; k < std::size(kSegments); ++k) {
      const QBarSet* set = series->barSets().at(static_cast<qsizetype>(k));
      QCOMPARE(set->count(), static_cast<qsizetype>(2 * mst.size()));
      for (std::size_t i = 0; i < mst.size(); ++i) {
        const json& m = mst[i];
        const json& p = pst[m["stage"].get<std::size_t>()];
        QCOMPARE(set->at(static_cast<qsizetype>(2 * i)), bytes(p, kSegments[k]) / (1 << 20));
        QCOMPARE(set->at(static_cast<qsizetype>(2 * i + 1)), bytes(m, kSegments[k]) / (1 << 20));
      }
    }
    // The weights of a stage are measured exactly as predicted (docs/gpu_backend.md).
    QVERIFY(series->barSets().at(0)->at(0) > 0);
    QCOMPARE(series->barSets().at(0)->at(1), series->barSets().at(0)->at(0));
    auto* memAxis =
        qobject_cast<QValueAxis*>(view.chartView()->chart()->axes(Qt::Vertical).value(0));
    QVERIFY(memAxis);
    QVERIFY(memAxis->titleText().contains(QStringLiteral("MiB")));

    // Communication: one category per (group, op); per measured stage a predicted and a measured
    // bar set, in MiB per step.
    auto* comm =
        qobject_cast<QBarSeries*>(view.communicationChartView()->chart()->series().value(0));
    QVERIFY(comm);
    const json& mcs = doc["measured"]["communication"]["stages"];
    QCOMPARE(comm->barSets().size(), static_cast<qsizetype>(2 * mcs.size()));
    auto* axis = qobject_cast<QBarCategoryAxis*>(
        view.communicationChartView()->chart()->axes(Qt::Horizontal).value(0));
    QVERIFY(axis);
    const auto predicted = commByLabel(doc["predicted"]["communication"]["stages"]);
    const auto measured = commByLabel(mcs);
    QVERIFY(!measured.empty());
    std::map<QString, bool> ops;  // "group op" over every stage
    for (const auto* side : {&predicted, &measured})
      for (const auto& [k, v] : *side) ops[k.section(QLatin1Char(' '), 1)] = true;
    QCOMPARE(axis->count(), static_cast<qsizetype>(ops.size()));
    const QStringList categories = view.communicationCategories();
    QCOMPARE(categories.size(), axis->count());
    for (qsizetype i = 0; i < axis->count(); ++i) {
      // The axis shows the same category over lines: "tp<br>reduce-<br>scatter".
      QCOMPARE(QString(axis->categories().at(i))
                   .remove(QStringLiteral("-<br>"))
                   .replace(QStringLiteral("<br>"), QStringLiteral(" ")),
               QString(categories.at(i)).remove(QLatin1Char('_')));
    }
    for (std::size_t s = 0; s < mcs.size(); ++s) {
      const int stage = mcs[s]["stage"].get<int>();
      const QBarSet* p = comm->barSets().at(static_cast<qsizetype>(2 * s));
      const QBarSet* m = comm->barSets().at(static_cast<qsizetype>(2 * s + 1));
      QCOMPARE(p->label(), QStringLiteral("S%1 predicted").arg(stage));
      QCOMPARE(m->label(), QStringLiteral("S%1 measured").arg(stage));
      for (qsizetype i = 0; i < axis->count(); ++i) {
        const QString key = QStringLiteral("S%1 %2").arg(stage).arg(categories.at(i));
        QVERIFY2(ops.count(categories.at(i)), qPrintable(key));
        const double pb = predicted.count(key) ? predicted.at(key) : 0.0;
        const double mb = measured.count(key) ? measured.at(key) : 0.0;
        QCOMPARE(p->at(i), pb / (1 << 20));
        QCOMPARE(m->at(i), mb / (1 << 20));
      }
    }

    // Every relative error is a row (null ones read n/a); time and losses are in the summary.
    QCOMPARE(view.errorTable()->rowCount(), static_cast<int>(leaves(doc["relative_error"])));
    const QString summary = view.summaryText();
    QVERIFY(summary.contains(QStringLiteral("tiny-gpt")));
    QVERIFY(summary.contains(QStringLiteral(" ms")));
    for (const json& l : doc["losses"])
      QVERIFY2(summary.contains(QString::number(l.get<double>(), 'f', 4)), qPrintable(summary));
  }

  void communicationLogScaleKeepsTheBars() {
    ValidationView view;
    QVERIFY(view.openFile(kFixture));
    auto values = [&view] {
      auto* s =
          qobject_cast<QBarSeries*>(view.communicationChartView()->chart()->series().value(0));
      std::vector<double> out;
      for (const QBarSet* set : s->barSets())
        for (qsizetype i = 0; i < set->count(); ++i) out.push_back(set->at(i));
      return out;
    };
    const std::vector<double> linear = values();
    view.setCommunicationLogScale(true);
    QVERIFY(view.communicationLogScale());
    auto* logAxis = qobject_cast<QLogValueAxis*>(
        view.communicationChartView()->chart()->axes(Qt::Vertical).value(0));
    QVERIFY(logAxis);
    const std::vector<double> logged = values();
    QCOMPARE(logged.size(), linear.size());
    for (std::size_t i = 0; i < linear.size(); ++i) {
      // Positive bars are unchanged; an absent collective sits on the axis floor.
      if (linear[i] > 0)
        QCOMPARE(logged[i], linear[i]);
      else
        QCOMPARE(logged[i], logAxis->min());
      QVERIFY(logged[i] >= logAxis->min() && logged[i] <= logAxis->max());
    }
    view.setCommunicationLogScale(false);
    QVERIFY(qobject_cast<QValueAxis*>(
        view.communicationChartView()->chart()->axes(Qt::Vertical).value(0)));
  }

  void anOutOfMemoryResultLoadsWithoutBars() {
    // The document `distplan validate` writes when the run ran out of memory, for the fixture's
    // scenario: the library's report of a run that did not fit.
    const json fixture = json::parse(readAll(kFixture).toStdString());
    const distplan::Scenario s = distplan::scenario_from_json(fixture["scenario"]);
    const json doc = distplan::backend::to_json(
        distplan::backend::compare(s, distplan::sim::plan(s), nullptr, "out of host memory", {}));
    ValidationView view;
    QVERIFY(view.loadResult(QByteArray::fromStdString(doc.dump())));
    QVERIFY(view.summaryText().contains(QStringLiteral("out of host memory")));
    QCOMPARE(view.errorTable()->rowCount(), 1);  // relative_error/memory/fits
    auto* series = qobject_cast<QStackedBarSeries*>(view.chartView()->chart()->series().value(0));
    QVERIFY(series);
    for (const QBarSet* set : series->barSets()) QCOMPARE(set->count(), 0);
    QVERIFY(!view.loadResult("{\"schema\": \"distplan.plan/v1\", \"memory\": {}}"));
    QVERIFY(view.logText().contains(QStringLiteral("/schema")));
    ValidationView empty;
    QVERIFY(!empty.saveResult(QDir::temp().filePath(QStringLiteral("never-written.json"))));
  }

  void theCellsShowTheResultsFigures() {
    // The oracle is the document as the CLI wrote it, read here with plain JSON access.
    const json doc = json::parse(readAll(kFixture).toStdString());
    ValidationView view;
    QVERIFY(view.openFile(kFixture));
    std::map<QString, int> rowOf;
    const QTableWidget* table = view.errorTable();
    for (int i = 0; i < table->rowCount(); ++i) rowOf[table->item(i, 0)->text()] = i;
    const json& mem = doc["relative_error"]["memory"]["stages"];
    for (const json& st : mem) {
      for (auto it = st.begin(); it != st.end(); ++it) {
        if (it.key() == "stage") continue;
        const QString name = QStringLiteral("memory/stage %1/%2")
                                 .arg(st["stage"].get<int>())
                                 .arg(QString::fromStdString(it.key()));
        QVERIFY2(rowOf.count(name), qPrintable(name));
        const QVariant cell = table->item(rowOf.at(name), 1)->data(Qt::DisplayRole);
        if (it.value().is_null()) {
          QCOMPARE(cell.toString(), QStringLiteral("n/a"));
        } else {
          // Percent with 3 decimals.
          QCOMPARE(cell.toDouble(), std::round(it.value().get<double>() * 1e5) / 1e3);
        }
      }
    }
    const QString step = QStringLiteral("time/simulated_step_seconds");
    QVERIFY(rowOf.count(step));
    QCOMPARE(
        table->item(rowOf.at(step), 1)->data(Qt::DisplayRole).toDouble(),
        std::round(doc["relative_error"]["time"]["simulated_step_seconds"].get<double>() * 1e5) /
            1e3);
    // The summary's simulated step, in ms with 3 decimals.
    QVERIFY(view.summaryText().contains(
        QStringLiteral("predicted %1 ms")
            .arg(doc["predicted"]["time"]["simulated_step_seconds"].get<double>() * 1e3, 0, 'f',
                 3)));
  }

  void aMalformedOrStaleFileShowsTheLibrarysPathError() {
    const json doc = json::parse(readAll(kFixture).toStdString());
    QTemporaryDir dir;
    struct Case {
      const char* file;
      QString path;
      QString reason;
    };
    json negative = doc;
    negative["measured"]["memory"]["stages"][0]["weights_bytes"] = -1;
    json stale = doc;
    stale["predicted"]["memory"]["stages"][1]["activations_bytes"] =
        doc["predicted"]["memory"]["stages"][1]["activations_bytes"].get<long long>() + 1;
    const std::pair<json, Case> cases[] = {
        {negative,
         {"negative.json", QStringLiteral("/measured/memory/stages/0/weights_bytes"),
          QStringLiteral("at least 0")}},
        {stale,
         {"stale.json", QStringLiteral("/predicted/memory/stages/1/activations_bytes"),
          QStringLiteral("recomputed from /scenario")}}};
    for (const auto& [bad, c] : cases) {
      const QString path = dir.filePath(QString::fromLatin1(c.file));
      QFile f(path);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(QByteArray::fromStdString(bad.dump(2)));
      f.close();
      ValidationView view;
      QSignalSpy loaded(&view, &ValidationView::resultLoaded);
      QVERIFY(!view.openFile(path));
      QCOMPARE(loaded.count(), 0);
      QVERIFY2(view.logText().contains(c.path + QStringLiteral(": ")), qPrintable(view.logText()));
      QVERIFY2(view.logText().contains(c.reason), qPrintable(view.logText()));
    }
  }

  void theCliIsFoundBesideTheGuiBuild() {
    // Tests run from build/tests/gui; the GUI from build/gui: both reach build/cli/distplan.
    QCOMPARE(ValidationView::defaultCliPath(),
             QFileInfo(QStringLiteral(DISTPLAN_CLI_EXE)).canonicalFilePath());
  }

  void aCpuRunStartedFromTheViewShowsItsResult() {
    if (QStandardPaths::findExecutable(QStringLiteral("mpirun")).isEmpty() &&
        QStandardPaths::findExecutable(QStringLiteral("mpiexec")).isEmpty())
      QSKIP("no mpirun on PATH: the 8-rank layout needs it");
    ValidationView view;
    view.setCliPath(QStringLiteral(DISTPLAN_CLI_EXE));
    QVERIFY(!view.startRun());  // no scenario yet
    QVERIFY(view.logText().contains(QStringLiteral("no scenario")));
    view.setScenarioDocument(readAll(kScenario));
    QSignalSpy finished(&view, &ValidationView::runFinished);
    QSignalSpy loaded(&view, &ValidationView::resultLoaded);
    QVERIFY(view.startRun());
    QVERIFY(view.isRunning());
    QVERIFY(!view.startRun());  // one run at a time
    QVERIFY(finished.wait(240000));
    QVERIFY2(finished.at(0).at(0).toInt() == 0, qPrintable(view.logText()));
    QVERIFY2(finished.at(0).at(1).toBool(), qPrintable(view.logText()));
    QCOMPARE(loaded.count(), 1);
    QVERIFY(!view.isRunning());
    QVERIFY(view.logText().contains(QStringLiteral("validate --device cpu")));
    QVERIFY(view.logText().contains(QStringLiteral("exit code 0")));
    // Two stages measured: predicted and measured bars for each; weights measured as predicted.
    auto* series = qobject_cast<QStackedBarSeries*>(view.chartView()->chart()->series().value(0));
    QVERIFY(series);
    const QBarSet* weights = series->barSets().at(0);
    QCOMPARE(weights->count(), 4);
    for (qsizetype i = 0; i < 4; i += 2) {
      QVERIFY(weights->at(i) > 0);
      QCOMPARE(weights->at(i + 1), weights->at(i));
    }
    QVERIFY(view.errorTable()->rowCount() > 0);
    QVERIFY(view.summaryText().contains(QStringLiteral("Loss per step")));
    // The run's result saves as the CLI wrote it and opens again with the same bars.
    QTemporaryDir dir;
    const QString saved = dir.filePath(QStringLiteral("run.result.json"));
    QVERIFY(view.saveResult(saved));
    const json doc = json::parse(readAll(saved).toStdString());
    QCOMPARE(doc["schema"].get<std::string>(), std::string("distplan.validate/v1"));
    QCOMPARE(doc["ranks"].get<int>(), 8);
    ValidationView reopened;
    QVERIFY(reopened.openFile(saved));
    auto* again =
        qobject_cast<QStackedBarSeries*>(reopened.chartView()->chart()->series().value(0));
    QVERIFY(again);
    for (qsizetype k = 0; k < series->barSets().size(); ++k)
      for (qsizetype i = 0; i < series->barSets().at(k)->count(); ++i)
        QCOMPARE(again->barSets().at(k)->at(i), series->barSets().at(k)->at(i));
  }

  void anEmulatedRankShowsOnlyItsStage() {
    // Rank 5 of tp2·pp2·dp2 is on stage 1: rank = tp_rank + t·(dp_rank + dp·pp_rank)
    // (docs/layout.md), 5 = 1 + 2·(0 + 2·1). The CLI runs it in process, without mpirun.
    QProcess cli;
    cli.start(QStringLiteral(DISTPLAN_CLI_EXE),
              {QStringLiteral("validate"), QStringLiteral("--device"), QStringLiteral("cpu"),
               QStringLiteral("--steps"), QStringLiteral("1"), QStringLiteral("--emulate-rank"),
               QStringLiteral("5"), kScenario});
    QVERIFY(cli.waitForFinished(120000));
    QVERIFY2(cli.exitCode() == 0, cli.readAllStandardError().constData());
    const QByteArray out = cli.readAllStandardOutput();
    const json doc = json::parse(out.toStdString());
    QCOMPARE(doc["measured"]["memory"]["stages"].size(), std::size_t{1});
    const int stage = doc["measured"]["memory"]["stages"][0]["stage"].get<int>();
    QCOMPARE(stage, 1);
    ValidationView view;
    QVERIFY(view.loadResult(out));
    auto* series = qobject_cast<QStackedBarSeries*>(view.chartView()->chart()->series().value(0));
    QVERIFY(series);
    const QBarSet* weights = series->barSets().at(0);
    QCOMPARE(weights->count(), 2);
    // The predicted bar is the measured stage's, not stage 0's.
    QCOMPARE(weights->at(0),
             doc["predicted"]["memory"]["stages"][static_cast<std::size_t>(stage)]["weights_bytes"]
                     .get<double>() /
                 view.memoryUnitBytes());
    QCOMPARE(weights->at(1), weights->at(0));
    auto* comm =
        qobject_cast<QBarSeries*>(view.communicationChartView()->chart()->series().value(0));
    QVERIFY(comm);
    QCOMPARE(comm->barSets().size(), 2);
    QCOMPARE(comm->barSets().at(0)->label(), QStringLiteral("S%1 predicted").arg(stage));
    QVERIFY(view.summaryText().contains(QStringLiteral("Emulated rank 5")));
  }

  void aRejectedScenarioShowsTheCliErrorInTheLog() {
    // tp = 3 does not divide tiny-gpt's 4 attention heads: the CLI refuses before any rank runs,
    // with its JSON error on stderr and exit code 2 (API.md "Errors").
    json scenario = json::parse(readAll(kScenario).toStdString());
    scenario["parallel"]["tp"] = 3;
    scenario["cluster"]["num_gpus"] = 12;  // tp·pp·dp: the head count is what is wrong
    ValidationView view;
    view.setCliPath(QStringLiteral(DISTPLAN_CLI_EXE));
    view.setScenarioDocument(QByteArray::fromStdString(scenario.dump()));
    QVERIFY(view.openFile(kFixture));
    QSignalSpy finished(&view, &ValidationView::runFinished);
    QVERIFY(view.startRun());
    QVERIFY(finished.wait(60000));
    QCOMPARE(finished.at(0).at(0).toInt(), 2);
    QCOMPARE(finished.at(0).at(1).toBool(), false);
    QVERIFY2(view.logText().contains(QStringLiteral("/parallel/tp")), qPrintable(view.logText()));
    QVERIFY(view.logText().contains(QStringLiteral("exit code 2")));
    // The result on screen stays.
    QVERIFY(view.summaryText().contains(QStringLiteral("tiny-gpt")));
  }

  void stoppingARunStopsMpirunAndItsRanks() {
#ifndef Q_OS_LINUX
    QSKIP("finds the ranks through /proc");
#endif
    if (QStandardPaths::findExecutable(QStringLiteral("mpirun")).isEmpty())
      QSKIP("no mpirun on PATH: the 8-rank layout needs it");
    ValidationView view;
    view.setCliPath(QStringLiteral(DISTPLAN_CLI_EXE));
    view.setScenarioDocument(readAll(kScenario));
    auto* steps = view.findChild<QSpinBox*>();
    QVERIFY(steps);
    steps->setValue(1000);  // minutes of training: the run is stopped long before its end
    QSignalSpy finished(&view, &ValidationView::runFinished);
    QVERIFY(view.startRun());
    // The CLI (a child of this test), its mpirun, and mpirun's ranks.
    std::vector<qint64> tree;
    QElapsedTimer clock;
    clock.start();
    while (clock.elapsed() < 30000) {
      tree.clear();
      for (qint64 cli : childrenOf(QCoreApplication::applicationPid())) {
        tree.push_back(cli);
        for (qint64 mpirun : childrenOf(cli)) {
          tree.push_back(mpirun);
          for (qint64 rank : childrenOf(mpirun)) tree.push_back(rank);
        }
      }
      if (tree.size() >= 2 + 8) break;
      QTest::qWait(100);
    }
    QVERIFY2(tree.size() >= 2 + 8, qPrintable(QStringLiteral("%1 processes").arg(tree.size())));
    view.stopRun();
    QVERIFY(finished.wait(10000));
    QCOMPARE(finished.at(0).at(1).toBool(), false);
    QVERIFY(!view.isRunning());
    // Every process of the run ends (SIGTERM to mpirun's group, SIGKILL 3 s later).
    QTRY_VERIFY_WITH_TIMEOUT(std::none_of(tree.begin(), tree.end(), alive), 10000);
  }
};

QTEST_MAIN(ValidationTest)
#include "validation_test.moc"
