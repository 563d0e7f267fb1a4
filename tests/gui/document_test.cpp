// The GUI shows and saves the file, never something else (issue 18, item 4): open then save writes
// the bytes read; an edit changes exactly the field edited; every value a widget shows reads back
// as the document's value; the plan is the planner's plan of the document. Over every scenario
// fixture and a few hundred random scenarios with the fields the old editor dropped or clamped.
#include <random>

#include <QDir>
#include <QDirIterator>
#include <QFile>
#include <QLabel>
#include <QTemporaryDir>
#include <QtTest>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "guitestutil.h"
#include "mainwindow.h"
#include "plansession.h"
#include "scenarioeditor.h"
#include "summaryview.h"
#include "valuefield.h"

using namespace distplan;
using namespace distplan::gui;
using namespace distplan::gui::test;
using nlohmann::json;

namespace {

QByteArray readBytes(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

bool writeBytes(const QString& path, const QByteArray& bytes) {
  QFile f(path);
  return f.open(QIODevice::WriteOnly) && f.write(bytes) == bytes.size();
}

/// Every scenario document checked in: data/scenarios, the validation scenarios, the docs'.
QStringList fixtures() {
  QStringList out;
  for (const char* dir : {"/data/scenarios", "/data/validation", "/docs/screenshots"}) {
    QDirIterator it(QStringLiteral(DISTPLAN_SOURCE_DIR) + QLatin1String(dir),
                    {QStringLiteral("*.json")}, QDir::Files);
    while (it.hasNext()) {
      const QString path = it.next();
      if (!path.endsWith(QStringLiteral(".result.json"))) out << path;
    }
  }
  out.sort();
  return out;
}

/// A random scenario with the fields the old editor dropped, rounded or clamped. Not all are
/// valid; the caller keeps those the planner accepts.
json randomScenario(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<long long> v) {
    return *(v.begin() + std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng));
  };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<>(lo, hi)(rng); };
  const long long tp = pick({1, 2, 4, 8});
  const long long pp = pick({1, 2, 4});
  const long long dp = pick({1, 2, 3, 16, 1024, 32768});
  const long long heads = tp * pick({1, 2, 4, 8});
  const long long layers = pp * pick({1, 2, 3, 5});
  json model = {{"name", "random model #" + std::to_string(rng() % 1000)},
                {"num_layers", layers},
                {"hidden_size", heads * pick({64, 128, 96})},
                {"num_attention_heads", heads},
                {"ffn_hidden_size", tp * pick({256, 1000, 4096})},
                {"vocab_size", pick({32000, 50257, 151936, 20000003})},
                {"mlp", rng() % 2 ? "gelu" : "swiglu"},
                {"norm", rng() % 2 ? "layernorm" : "rmsnorm"},
                {"position_embedding", "rotary"}};
  json doc = {{"model", model},
              {"cluster",
               {{"gpu", rng() % 2 ? json("h100-sxm-80gb")
                                  : json{{"preset", "a100-80gb"},
                                         {"memory_bytes", 85899345920LL + 12345},
                                         {"peak_flops", {{"bf16", 311.123456789e12}}}}},
                {"num_gpus", tp * pp * dp},
                {"gpus_per_node", 8}}},
              {"training",
               {{"seq_length", pick({512, 2048})},
                {"global_batch_size", dp * pick({1, 2, 64})},
                {"micro_batch_size", 1},
                {"precision", "bf16"},
                {"optimizer", "adamw"}}},
              {"parallel",
               {{"tp", tp},
                {"pp", pp},
                {"zero_stage", pick({0, 1, 2, 3})},
                {"recompute", rng() % 2 ? "selective" : "full"},
                {"schedule", "1f1b"}}}};
  if (rng() % 2) doc["parallel"]["dp"] = dp;
  if (rng() % 2) doc["training"]["dropout"] = real(1e-9, 1e-6);
  if (rng() % 2) doc["cluster"]["intra_node_latency"] = real(1e-7, 1e-5);
  if (rng() % 2) doc["cluster"]["inter_node_latency"] = real(1e-7, 1e-4);
  if (rng() % 2) doc["cluster"]["intra_node_bandwidth"] = real(1e10, 1e12);
  json assumptions = json::object();
  if (rng() % 2) assumptions["compute_efficiency"] = real(0.1, 0.9);
  if (rng() % 2) assumptions["communication_efficiency"] = real(0.1, 0.9);
  if (rng() % 2) assumptions["overlap_grad_reduce"] = false;
  if (rng() % 2) assumptions["overlap_param_gather"] = false;
  if (rng() % 2) assumptions["vocab_pad_multiple"] = pick({1, 64, 128});
  if (rng() % 2) assumptions["zero3_prefetch_layers"] = pick({0, 1, 2});
  if (!assumptions.empty()) doc["assumptions"] = assumptions;
  if (pp > 1 && rng() % 2) {
    json lps = json::array();
    long long left = layers;
    for (long long s = 0; s < pp - 1; ++s) {
      lps.push_back(1);
      --left;
    }
    lps.push_back(left);
    doc["parallel"]["layers_per_stage"] = lps;
  }
  return doc;
}

/// Every field the editor shows that the document holds reads back, through the field's own
/// parser, as exactly the document's value.
void expectWidgetsShowTheDocument(MainWindow& w, const json& doc) {
  const auto fields = w.editor()->findChildren<ValueField*>();
  QVERIFY(fields.size() > 20);
  for (ValueField* f : fields) {
    const std::string path = f->objectName().toStdString();
    const json::json_pointer ptr(path);
    bool held = false;
    try {
      held = doc.contains(ptr);
    } catch (const json::exception&) {
      held = false;  // a preset name on the way: the value is the preset's
    }
    if (!held) continue;
    QVERIFY2(f->showsDocumentValue(), path.c_str());
    const json shown = f->valueForText(f->text());
    const json& original = doc.at(ptr);
    if (original.is_number_float() && shown.is_number()) {
      QVERIFY2(shown.get<double>() == original.get<double>(),
               qPrintable(QStringLiteral("%1: shown %2, document %3")
                              .arg(QString::fromStdString(path), f->text(),
                                   QString::fromStdString(original.dump()))));
    } else {
      QVERIFY2(shown == original, qPrintable(QStringLiteral("%1: shown %2, document %3")
                                                 .arg(QString::fromStdString(path), f->text(),
                                                      QString::fromStdString(original.dump()))));
    }
  }
}

/// Opens `path`, checks the plan and the widgets, saves unedited (bytes equal), then edits one
/// field and saves again (the document differs from the original at that field only).
void roundTrip(const QString& path, const QString& saveDir) {
  const QByteArray original = readBytes(path);
  const json doc = parse_json_text(std::string_view(original.constData(), original.size()));
  MainWindow w(false);
  QString error;
  QVERIFY2(w.openScenario(path, &error), qPrintable(error));
  QVERIFY(w.session()->waitForPlan());
  QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
  QVERIFY(w.editor()->document() == doc);
  // The plan is the planner's plan of the file, not of the widgets.
  const Scenario s = scenario_from_json(doc);
  QCOMPARE(w.session()->scenario(), s);
  QCOMPARE(w.session()->estimate(), sim::plan(s));
  expectWidgetsShowTheDocument(w, doc);
  if (QTest::currentTestFailed()) return;

  const QString saved = saveDir + QStringLiteral("/unedited.json");
  QVERIFY2(w.saveScenario(saved, &error), qPrintable(error));
  QCOMPARE(readBytes(saved), original);

  // One edit: the global batch doubles. Everything else stays, value for value.
  const Count batch = s.training.global_batch_size;
  QVERIFY(setCount(w, "/training/global_batch_size", 2 * batch));
  const QString edited = saveDir + QStringLiteral("/edited.json");
  QVERIFY2(w.saveScenario(edited, &error), qPrintable(error));
  const QByteArray editedBytes = readBytes(edited);
  const json after = parse_json_text(std::string_view(editedBytes.constData(), editedBytes.size()));
  const json patch = json::diff(doc, after);
  QCOMPARE(patch.size(), std::size_t{1});
  QCOMPARE(patch[0]["path"].get<std::string>(), std::string("/training/global_batch_size"));
  QCOMPARE(after["training"]["global_batch_size"].get<Count>(), 2 * batch);
}

}  // namespace

class DocumentTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void everyFixtureRoundTrips_data() {
    QTest::addColumn<QString>("path");
    const QStringList all = fixtures();
    QVERIFY(all.size() >= 5);
    for (const QString& p : all) QTest::newRow(qPrintable(QFileInfo(p).fileName())) << p;
  }

  void everyFixtureRoundTrips() {
    QFETCH(QString, path);
    QTemporaryDir dir;
    roundTrip(path, dir.path());
  }

  void randomScenariosRoundTrip() {
    std::mt19937_64 rng(20261201);
    QTemporaryDir dir;
    int accepted = 0;
    for (int i = 0; i < 400 && accepted < 60; ++i) {
      const json doc = randomScenario(rng);
      try {
        (void)scenario_from_json(doc);
      } catch (const InputError&) {
        continue;  // the planner refuses it: not a scenario the GUI opens
      }
      ++accepted;
      const QString path = dir.filePath(QStringLiteral("random%1.json").arg(i));
      // Compact or indented, with the key order the generator used: bytes must survive as read.
      QVERIFY(writeBytes(path, QByteArray::fromStdString(doc.dump(i % 2 ? -1 : 3) + "\n")));
      roundTrip(path, dir.path());
      if (QTest::currentTestFailed()) {
        qWarning("failing document: %s", doc.dump().c_str());
        return;
      }
    }
    QVERIFY2(accepted >= 50, qPrintable(QString::number(accepted)));
  }

  // The issue's example: the CLI plans 85.83 GiB on stage 3 (74 layers), which does not fit.
  void unevenStagesAreShownAsTheFileSays() {
    QTemporaryDir dir;
    json doc = parse_json_text(default_scenario_text());
    doc["parallel"]["layers_per_stage"] = {2, 2, 2, 74};
    const QString path = dir.filePath(QStringLiteral("uneven.json"));
    QVERIFY(writeBytes(path, QByteArray::fromStdString(doc.dump(2))));
    MainWindow w(false);
    QString error;
    QVERIFY2(w.openScenario(path, &error), qPrintable(error));
    QVERIFY(w.session()->waitForPlan());
    const Estimate e = sim::plan(scenario_from_json(doc));
    QVERIFY(!e.memory.fits);
    QCOMPARE(w.session()->estimate(), e);
    QCOMPARE(w.session()->scenario().parallel.layers_per_stage, (std::vector<Count>{2, 2, 2, 74}));
    // 85.83 GiB as `distplan plan --format table` prints it for this file.
    QCOMPARE(QString::number(to_gib(w.session()->estimate().memory.peak_bytes), 'f', 2),
             QStringLiteral("85.83"));
    QVERIFY(w.summaryView()->figureText(QStringLiteral("fits")).contains(QStringLiteral("no")));
    QVERIFY2(w.editor()->otherFieldsText().contains(QStringLiteral("/parallel/layers_per_stage")),
             qPrintable(w.editor()->otherFieldsText()));
  }

  // Every fit suggestion, applied, gives the planner's plan of the suggested scenario and keeps the
  // file's other fields (the uneven stage split stays unless the suggestion changes pp).
  void fitSuggestionsApplyOnlyTheirChange() {
    QTemporaryDir dir;
    json doc = parse_json_text(default_scenario_text());
    doc["parallel"]["layers_per_stage"] = {2, 2, 2, 74};
    doc["assumptions"] = {{"vocab_pad_multiple", 128}, {"zero3_prefetch_layers", 2}};
    const QString path = dir.filePath(QStringLiteral("uneven.json"));
    QVERIFY(writeBytes(path, QByteArray::fromStdString(doc.dump(2))));
    const Scenario base = scenario_from_json(doc);
    const std::size_t count = fit_suggestions(base, sim::plan(base), [](const Scenario& x) {
                                return sim::plan(x);
                              }).size();
    QVERIFY(count >= 3);
    for (std::size_t i = 0; i < count; ++i) {
      MainWindow w(false);
      QString error;
      QVERIFY2(w.openScenario(path, &error), qPrintable(error));
      QVERIFY(w.session()->waitForPlan());
      QCOMPARE(w.summaryView()->suggestions().size(), count);
      const FitSuggestion chosen = w.summaryView()->suggestions()[i];
      emit w.summaryView()->suggestionChosen(static_cast<int>(i));
      QVERIFY(w.session()->waitForPlan());
      QVERIFY2(w.session()->isValid(), qPrintable(QString::fromStdString(chosen.change) + ": " +
                                                  w.session()->errorMessage()));
      QCOMPARE(w.session()->scenario(), chosen.scenario);
      QCOMPARE(w.session()->estimate().memory.peak_bytes, chosen.peak_bytes);
      const json& after = w.editor()->document();
      QCOMPARE(after["assumptions"], doc["assumptions"]);
      QCOMPARE(after["model"], doc["model"]);
      if (chosen.scenario.parallel.pp == base.parallel.pp) {
        QCOMPARE(after["parallel"]["layers_per_stage"], doc["parallel"]["layers_per_stage"]);
      }
    }
  }

  // Above the old spin boxes' 2^20: 2,097,152 GPUs stay 2,097,152 and the plan is the planner's.
  void twoMillionGpusStayTwoMillion() {
    QTemporaryDir dir;
    json doc = parse_json_text(default_scenario_text());
    doc["cluster"]["num_gpus"] = 2097152;
    doc["parallel"].erase("dp");
    doc["training"]["global_batch_size"] = 2097152 / 32 * 4;
    const QString path = dir.filePath(QStringLiteral("big.json"));
    QVERIFY(writeBytes(path, QByteArray::fromStdString(doc.dump(2))));
    const Scenario s = scenario_from_json(doc);
    QCOMPARE(s.cluster.num_gpus, Count{2097152});
    MainWindow w(false);
    QString error;
    QVERIFY2(w.openScenario(path, &error), qPrintable(error));
    QVERIFY(w.session()->waitForPlan());
    QCOMPARE(w.session()->scenario().cluster.num_gpus, Count{2097152});
    QCOMPARE(w.session()->estimate().time.step_seconds, sim::plan(s).time.step_seconds);
    auto* field = w.editor()->findChild<ValueField*>(QStringLiteral("/cluster/num_gpus"));
    QVERIFY(field);
    QCOMPARE(field->text(), QStringLiteral("2097152"));
    // Editing another field keeps it.
    QVERIFY(setCount(w, "/training/seq_length", 2048));
    QCOMPARE(w.editor()->document()["cluster"]["num_gpus"].get<Count>(), Count{2097152});
  }

  void typedValuesAreWrittenExactly() {
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(typeText(w, "/training/dropout", QStringLiteral("1e-7")));
    QCOMPARE(w.editor()->document()["training"]["dropout"].get<double>(), 1e-7);
    QVERIFY(typeText(w, "/assumptions/compute_efficiency", QStringLiteral("0.4321")));
    QCOMPARE(w.editor()->document()["assumptions"]["compute_efficiency"].get<double>(), 0.4321);
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->scenario().assumptions.compute_efficiency, 0.4321);
    // TFLOP/s: 989.4 is 989.4e12 FLOP/s exactly as the decimal says, on a preset GPU.
    QVERIFY(typeText(w, "/cluster/gpu/peak_flops/bf16", QStringLiteral("989.4")));
    const json& gpu = w.editor()->document()["cluster"]["gpu"];
    QCOMPARE(gpu["preset"].get<std::string>(), std::string("h100-sxm-80gb"));
    QCOMPARE(gpu["peak_flops"]["bf16"].get<double>(), 989.4e12);
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->scenario().cluster.gpu.peak_flops.bf16, 989.4e12);
    // Clearing a field removes the key: the default applies again.
    QVERIFY(typeText(w, "/training/dropout", QString()));
    QVERIFY(!w.editor()->document()["training"].contains("dropout"));
    // Text that is not a number goes to the planner, whose message names the field.
    QVERIFY(typeText(w, "/training/seq_length", QStringLiteral("lots")));
    QVERIFY(!w.session()->isValid());
    QCOMPARE(w.session()->errorPath(), QStringLiteral("/training/seq_length"));
  }

  // A value longer than a line edit holds by default (32767 characters) is not cut by focusing
  // and leaving its field.
  void longValuesSurviveFocus() {
    QTemporaryDir dir;
    json doc = parse_json_text(default_scenario_text());
    doc["model"] = {{"preset", "llama2-70b"}, {"name", std::string(40000, 'n')}};
    const QString path = dir.filePath(QStringLiteral("long.json"));
    QVERIFY(writeBytes(path, QByteArray::fromStdString(doc.dump(1))));
    MainWindow w(false);
    QString error;
    QVERIFY2(w.openScenario(path, &error), qPrintable(error));
    QVERIFY(w.session()->waitForPlan());
    auto* name = w.editor()->findChild<ValueField*>(QStringLiteral("/model/name"));
    QVERIFY(name);
    QCOMPARE(name->text().size(), qsizetype{40000});
    name->setFocus();
    emit name->editingFinished();
    QVERIFY(w.editor()->document() == doc);
  }

  void decimalShiftIsExact_data() {
    QTest::addColumn<QString>("number");
    QTest::addColumn<int>("k");
    QTest::addColumn<QString>("expected");
    QTest::newRow("tera") << "989500000000000.0" << 12 << "989.5";
    QTest::newRow("exponent") << "1.979e+15" << 12 << "1979";
    QTest::newRow("giga") << "50000000000.0" << 9 << "50";
    QTest::newRow("fraction") << "123456789" << 12 << "0.000123456789";
    QTest::newRow("tiny") << "1e-300" << 12 << "1e-312";
    QTest::newRow("back") << "989.4" << -12 << "989400000000000";
    QTest::newRow("negative") << "-2.5" << 1 << "-0.25";
    QTest::newRow("zero") << "0.0" << 12 << "0";
  }

  void decimalShiftIsExact() {
    QFETCH(QString, number);
    QFETCH(int, k);
    QFETCH(QString, expected);
    QCOMPARE(shiftDecimal(number, k), expected);
  }

  // Over random doubles: the shown TFLOP/s and GB/s text reads back as the very same double.
  void scaledFieldsReadBackBitForBit() {
    std::mt19937_64 rng(7);
    for (FieldUnit unit : {FieldUnit::tera, FieldUnit::giga, FieldUnit::giB, FieldUnit::plain}) {
      ValueField field(unit);
      for (int i = 0; i < 2000 && unit != FieldUnit::giB; ++i) {
        const double v = std::ldexp(std::uniform_real_distribution<>(1, 2)(rng),
                                    static_cast<int>(rng() % 120) - 20);
        const json value = v;
        const json back = field.valueForText(field.textForValue(value));
        QVERIFY2(
            back.is_number() && back.get<double>() == v,
            qPrintable(QStringLiteral("%1 -> %2")
                           .arg(QString::fromStdString(value.dump()), field.textForValue(value))));
      }
      // Whole bytes: GiB text of any byte count reads back as that count.
      if (unit == FieldUnit::giB) {
        for (long long bytes : {1LL, 85899345920LL + 12345, (1LL << 50) - 1}) {
          QCOMPARE(field.valueForText(field.textForValue(bytes)).get<long long>(), bytes);
        }
      }
    }
  }
};

QTEST_MAIN(DocumentTest)
#include "document_test.moc"
