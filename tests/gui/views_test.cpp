// The result views: the timeline draws the simulated step (one row per stage, one block per pass),
// the search fills a sortable table and loads a plan, communication lists every collective, the
// validation view reads a result, and charts export as PNG and SVG.
#include <algorithm>
#include <vector>

#include <QDoubleSpinBox>
#include <QFile>
#include <QLabel>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>
#include <nlohmann/json.hpp>

#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QStackedBarSeries>

#include "categories.h"
#include "chartexport.h"
#include "communicationmodel.h"
#include "communicationview.h"
#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "guitestutil.h"
#include "mainwindow.h"
#include "memorymodel.h"
#include "memoryview.h"
#include "plansession.h"
#include "searchmodel.h"
#include "searchview.h"
#include "summaryview.h"
#include "timelineview.h"
#include "timelinewidget.h"
#include "validationview.h"

using namespace distplan;
using namespace distplan::gui;
using namespace distplan::gui::test;

class ViewsTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void timelineHasOneRowPerStageAndOneBlockPerPass_data() {
    QTest::addColumn<QString>("schedule");
    QTest::addColumn<int>("virtualStages");
    QTest::addColumn<bool>("splitBackward");
    QTest::newRow("1f1b") << QStringLiteral("1f1b") << 1 << false;
    QTest::newRow("gpipe") << QStringLiteral("gpipe") << 1 << false;
    QTest::newRow("interleaved") << QStringLiteral("interleaved_1f1b") << 2 << false;
    QTest::newRow("zb_h1") << QStringLiteral("zb_h1") << 1 << true;
    QTest::newRow("zb_auto") << QStringLiteral("zb_auto") << 1 << true;
    QTest::newRow("zb_v") << QStringLiteral("zb_v") << 2 << true;
    QTest::newRow("v_half") << QStringLiteral("v_half") << 2 << true;
  }

  void timelineHasOneRowPerStageAndOneBlockPerPass() {
    if (!PlanSession::simulatorAvailable()) QSKIP("built without the simulator");
    QFETCH(QString, schedule);
    QFETCH(int, virtualStages);
    QFETCH(bool, splitBackward);
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(setCount(w, "/training/global_batch_size", 64));
    // Every schedule distplan models: its textbook framework runs them all (Megatron-LM, the
    // default, runs 1F1B and interleaving only).
    QVERIFY(chooseText(w, "/training/framework", QStringLiteral("generic")));
    QVERIFY(chooseText(w, "/parallel/schedule", schedule));
    if (virtualStages > 1) QVERIFY(setCount(w, "/parallel/virtual_stages", virtualStages));
    QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
    w.session()->simulateNow();
    QVERIFY(w.session()->hasSimulation());

    const Scenario& s = w.session()->scenario();
    const Count pp = s.parallel.pp;
    const Count m = s.num_microbatches();  // 64 / (micro-batch 1 * dp 2) = 32
    QCOMPARE(m, Count{32});
    TimelineWidget* t = w.timelineView()->timeline();
    QCOMPARE(t->rowCount(), static_cast<int>(pp));
    // Every stage runs every micro-batch forward and backward once per virtual chunk; a
    // zero-bubble schedule splits each backward into B (input) and W (weight) passes.
    const int passes = static_cast<int>(pp * m * virtualStages);
    QCOMPARE(t->blockCount(BlockKind::forward), passes);
    QCOMPARE(t->blockCount(BlockKind::backward), passes);
    QCOMPARE(t->blockCount(BlockKind::backward_weight), splitBackward ? passes : 0);
    // Point-to-point sends between stages are drawn: pp-1 boundaries, a forward and a backward
    // transfer per micro-batch and chunk crossing each.
    QVERIFY(t->blockCount(BlockKind::communication) >= 2 * (pp - 1) * m);
    // A step is the longest span of one stage; under a V the stages' steps overlap (docs/api.md),
    // so a block may end after step_seconds but no stage's span exceeds it.
    const double step = w.session()->simulation().step_seconds;
    std::vector<double> first(static_cast<std::size_t>(pp), 1e300), last(first.size(), -1e300);
    for (const TimelineBlock& b : t->timeline().blocks) {
      QVERIFY(b.stage >= 0 && b.stage < pp);
      QVERIFY(b.end_seconds >= b.start_seconds);
      if (virtualStages == 1 || schedule == QStringLiteral("interleaved_1f1b"))
        QVERIFY(b.end_seconds <= step * (1 + 1e-9));
      if (b.kind == BlockKind::communication) continue;
      first[static_cast<std::size_t>(b.stage)] =
          std::min(first[static_cast<std::size_t>(b.stage)], b.start_seconds);
      last[static_cast<std::size_t>(b.stage)] =
          std::max(last[static_cast<std::size_t>(b.stage)], b.end_seconds);
    }
    for (std::size_t st = 0; st < first.size(); ++st)
      QVERIFY(last[st] - first[st] <= step * (1 + 1e-9));
    QCOMPARE(t->timeline().step_seconds, w.session()->simulation().step_seconds);
  }

  void timelineZoomsAroundAPointAndFits() {
    TimelineWidget t;
    TimelineData d;
    d.num_stages = 2;
    d.step_seconds = 10;
    d.blocks.push_back({0, BlockKind::forward, 0, 0, 0.0, 1.0, {}});
    t.setTimeline(d);
    const double span = t.viewSpan();
    t.zoom(2.0, 5.0);
    QCOMPARE(t.viewSpan(), span / 2);
    QVERIFY(t.viewStart() < 5.0 && t.viewStart() + t.viewSpan() > 5.0);
    t.fit();
    QCOMPARE(t.viewStart(), 0.0);
    QCOMPARE(t.viewSpan(), span);
  }

  void communicationTableListsEveryCollective() {
    MainWindow w(false);
    loadDefault(w);
    const Estimate e = sim::plan(scenario_from_json(w.editor()->document()));
    CommunicationModel* model = w.communicationView()->model();
    QCOMPARE(model->rowCount(), static_cast<int>(e.communication.collectives.size()));
    for (int i = 0; i < model->rowCount(); ++i) {
      const Collective& c = e.communication.collectives[static_cast<std::size_t>(i)];
      QCOMPARE(model->data(model->index(i, CommunicationModel::WireBytesColumn), Qt::UserRole)
                   .toLongLong(),
               c.wire_bytes_per_gpu_per_step);
      QCOMPARE(model->data(model->index(i, CommunicationModel::BytesPerCallColumn), Qt::UserRole)
                   .toLongLong(),
               c.bytes_per_call);
    }
  }

  void summaryShowsThePlannersFigures() {
    MainWindow w(false);
    loadDefault(w);
    const Estimate& e = w.session()->estimate();
    QVERIFY(w.summaryView()
                ->figureText(QStringLiteral("memory"))
                .contains(formatGiB(e.memory.peak_reserved_bytes)));  // what fits compares
    QVERIFY(w.summaryView()
                ->figureText(QStringLiteral("step"))
                .contains(QString::number(e.time.step_seconds * 1e3, 'f', 1)));
    QVERIFY(
        w.summaryView()->figureText(QStringLiteral("fits")).contains(e.memory.fits ? "yes" : "no"));
  }

  // The levers line shows what the plan computes for offload (host memory per node, PCIe traffic)
  // and names cp and FP8 once a person picks them in the editor.
  void summaryShowsTheLeversWithThePlansFigures() {
    MainWindow w(false);
    loadDefault(w);
    auto* levers = w.summaryView()->findChild<QLabel*>(QStringLiteral("levers"));
    QVERIFY(levers != nullptr);
    QVERIFY(levers->text().isEmpty());  // the default scenario uses none
    QVERIFY(chooseText(w, "/parallel/offload_optimizer", QStringLiteral("cpu")));
    const Estimate& e = w.session()->estimate();
    QVERIFY(e.memory.host_bytes_per_node > 0);
    QVERIFY2(levers->text().contains(formatGiB(e.memory.host_bytes_per_node)),
             qPrintable(levers->text()));
    QVERIFY2(levers->text().contains(formatGiB(e.offload.pcie_bytes_per_gpu_per_step)),
             qPrintable(levers->text()));
    QVERIFY(chooseText(w, "/training/precision", QStringLiteral("fp8")));
    QVERIFY2(levers->text().contains(QStringLiteral("FP8")), qPrintable(levers->text()));
  }

  // The Memory tab has the CLI's columns, and each bar stands as high as the stage's reserved
  // bytes, the figure its title and "fits" use: categories + transient + the allocator's cache.
  void memoryBarsAddUpToReservedWithTheClisColumns() {
    MainWindow w(false);
    loadDefault(w);
    QVERIFY(chooseText(w, "/training/framework", QStringLiteral("megatron")));
    const Scenario& s = w.session()->scenario();
    const Estimate& e = w.session()->estimate();
    // The CLI's document of the same plan: its per-stage figures are the oracle of the cells.
    const nlohmann::json doc = plan_to_json(s, e);
    MemoryView* view = w.memoryView();
    MemoryModel* model = view->model();
    QCOMPARE(model->headerData(MemoryModel::ReservedColumn, Qt::Horizontal).toString(),
             QStringLiteral("Reserved"));
    for (int i = 0; i < model->rowCount(); ++i) {
      const nlohmann::json& st = doc.at("memory").at("stages").at(i);
      QVERIFY(st.at("transient_bytes").get<Bytes>() > 0);
      QVERIFY(st.at("reserved_bytes").get<Bytes>() > st.at("total_bytes").get<Bytes>());
      for (const auto& [column, key] : {std::pair{MemoryModel::TotalColumn, "total_bytes"},
                                        {MemoryModel::TransientColumn, "transient_bytes"},
                                        {MemoryModel::AllocatedColumn, "allocated_bytes"},
                                        {MemoryModel::ReservedColumn, "reserved_bytes"}}) {
        QCOMPARE(model->index(i, column).data(Qt::UserRole).toLongLong(), st.at(key).get<Bytes>());
      }
      const double reserved = to_gib(st.at("reserved_bytes").get<Bytes>());
      QVERIFY2(std::abs(view->stackGiB(i) - reserved) <= 1e-9 * reserved,
               qPrintable(QStringLiteral("%1 vs %2").arg(view->stackGiB(i)).arg(reserved)));
    }
  }

  // "What lowers the peak" lists the step time each change costs, as the CLI's table does.
  void fitSuggestionsShowTheirStepTimeCost() {
    MainWindow w(false);
    loadDefault(w);
    // The README's example that does not fit: no sequence parallelism, no ZeRO, tp 8 alone.
    nlohmann::json doc = w.editor()->document();
    doc["parallel"] = {{"tp", 8}, {"pp", 1}, {"zero_stage", 0}};
    w.editor()->setDocument(doc);
    w.session()->setDocument(doc);
    QVERIFY(w.session()->waitForPlan());
    QVERIFY(w.session()->isValid());
    QVERIFY(!w.session()->estimate().memory.fits);
    auto* table = w.summaryView()->findChild<QTableWidget*>();
    QVERIFY(table != nullptr && table->rowCount() > 0);
    QCOMPARE(table->horizontalHeaderItem(3)->text(), QStringLiteral("Step time"));
    // The CLI's table of the same plan: "<change> -X GiB -> Y GiB  +Z ms/step".
    const std::string cli = format_plan_table(w.session()->scenario(), w.session()->estimate(),
                                              [](const Scenario& x) { return sim::plan(x); });
    for (int row = 0; row < table->rowCount(); ++row) {
      const std::string change = table->item(row, 0)->text().toStdString();
      const std::size_t at = cli.find("    " + change + " ");
      QVERIFY2(at != std::string::npos, change.c_str());
      const std::size_t end = cli.find(" ms/step", at);
      const std::size_t begin = cli.rfind(' ', end - 1) + 1;
      const double cliMs = std::stod(cli.substr(begin, end - begin));
      const QString cell = table->item(row, 3)->text();
      QVERIFY2(cell.endsWith(QStringLiteral(" ms")), qPrintable(cell));
      QCOMPARE(cell.chopped(3).toDouble(), cliMs);
    }
  }

  // The margin control: plans within the margin of the GPU's memory are left out.
  void searchMarginKeepsPlansBelowTheUsableMemory() {
    if (!SearchView::searchAvailable()) QSKIP("built without the search library");
    MainWindow w(false);
    loadDefault(w);
    SearchView* view = w.searchView();
    auto* spin = view->findChild<QDoubleSpinBox*>(QStringLiteral("memoryMargin"));
    QVERIFY(spin != nullptr);
    QSignalSpy finished(view, &SearchView::searchFinished);
    const auto largestShare = [&] {
      double most = 0;
      for (const SearchRow& r : view->model()->rows()) {
        most = std::max(most,
                        static_cast<double>(r.peak_bytes) / static_cast<double>(r.capacity_bytes));
      }
      return most;
    };
    spin->setValue(0);
    view->startSearch();
    QVERIFY(finished.wait(240000));
    QVERIFY2(largestShare() > 0.9, "without a margin some plan uses more than 90 %");
    spin->setValue(10);
    QCOMPARE(view->memoryMargin(), 0.10);
    view->startSearch();
    QVERIFY(finished.wait(240000));
    QVERIFY(view->model()->rowCount() > 0);
    QVERIFY2(largestShare() <= 0.9, qPrintable(QString::number(largestShare())));
  }

  // Every parallel axis that is not 1 has its labelled column: a long sequence splits over cp.
  void searchTableShowsEveryAxisThatIsNotOne() {
    if (!SearchView::searchAvailable()) QSKIP("built without the search library");
    MainWindow w(false);
    loadDefault(w);
    SearchView* view = w.searchView();
    QSignalSpy finished(view, &SearchView::searchFinished);
    view->startSearch();
    QVERIFY(finished.wait(240000));
    // The default (4,096 tokens) never splits the sequence or the experts: no cp, no ep column.
    QVERIFY(view->table()->isColumnHidden(SearchModel::CpColumn));
    QVERIFY(view->table()->isColumnHidden(SearchModel::EpColumn));
    QVERIFY(!view->table()->isColumnHidden(SearchModel::VirtualStagesColumn));
    nlohmann::json doc = nlohmann::json::parse(R"({"model": "llama3.1-8b",
      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
      "training": {"seq_length": 131072, "global_batch_size": 8}})");
    w.editor()->setDocument(doc);
    w.session()->setDocument(doc);
    QVERIFY(w.session()->waitForPlan());
    view->startSearch();
    QVERIFY(finished.wait(240000));
    QVERIFY(!view->table()->isColumnHidden(SearchModel::CpColumn));
    QCOMPARE(view->model()->headerData(SearchModel::CpColumn, Qt::Horizontal).toString(),
             QStringLiteral("cp"));
    bool split = false;
    for (const SearchRow& r : view->model()->rows()) {
      QCOMPARE(r.parallel.tp * r.parallel.cp * r.parallel.pp * r.parallel.dp, Count{8});
      split = split || r.parallel.cp > 1;
    }
    QVERIFY(split);
  }

  // A Hugging Face config.json opens as the model of the scenario, through the library's
  // importer: GPT-NeoX-20B has 20,554,567,680 parameters in its released checkpoint.
  void huggingFaceConfigOpensAsTheModel() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("config.json"));
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"model_type": "gpt_neox", "num_hidden_layers": 44, "hidden_size": 6144,
      "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
      "max_position_embeddings": 2048, "architectures": ["GPTNeoXForCausalLM"]})");
    f.close();
    MainWindow w(false);
    loadDefault(w);
    QString error;
    QVERIFY2(w.openScenario(path, &error), qPrintable(error));
    QVERIFY(w.session()->waitForPlan());
    QVERIFY(w.session()->isValid());
    QCOMPARE(w.session()->estimate().parameters, Count{20554567680});
    QVERIFY(w.editor()->document().at("model").contains("hf_config"));
    // A config the importer refuses names its field and changes nothing.
    const nlohmann::json before = w.editor()->document();
    QFile g(dir.filePath(QStringLiteral("bad.json")));
    QVERIFY(g.open(QIODevice::WriteOnly));
    g.write(R"({"model_type": "llama"})");
    g.close();
    QVERIFY(!w.openScenario(g.fileName(), &error));
    QVERIFY2(error.contains(QStringLiteral("/model/hf_config")), qPrintable(error));
    QCOMPARE(w.editor()->document(), before);
  }

  // Thousands of micro-batches: passes narrower than a few pixels are shaded by the busy share of
  // each pixel, so the steady state is one band (no alternating stripes), and each stage's idle
  // share is the simulator's.
  void timelineOfThousandsOfMicroBatchesReadsAsBandsAndBubbles() {
    if (!PlanSession::simulatorAvailable()) QSKIP("built without the simulator");
    MainWindow w(false);
    loadDefault(w);
    w.session()->simulateNow();
    QVERIFY(w.session()->hasSimulation());
    const SimulationSummary& sim = w.session()->simulation();
    QVERIFY(w.session()->estimate().num_microbatches >= 256);
    TimelineWidget t;
    t.resize(1200, 600);
    t.setTimeline(sim.timeline);
    const QImage image = t.grab().toImage();
    QVERIFY(t.lastPaintAggregated());
    for (int s = 0; s < t.rowCount(); ++s) {
      const double simulator =
          1 - sim.stage_busy_seconds[static_cast<std::size_t>(s)] / sim.step_seconds;
      QVERIFY2(
          std::abs(t.idleFraction(s) - simulator) < 1e-9,
          qPrintable(
              QStringLiteral("stage %1: %2 vs %3").arg(s).arg(t.idleFraction(s)).arg(simulator)));
    }
    // Along the middle of stage 1's compute lane, over the middle half of the step: few colour
    // changes (drawn pass by pass, forward and backward alternate every pixel or two).
    const double plotLeft = 80, plotWidth = t.width() - 80 - 12;
    const double rowHeight = (t.height() - 28 - 30) / static_cast<double>(t.rowCount());
    const int y = static_cast<int>(28 + 1.35 * rowHeight);
    // A change is a step of more than 24 in a channel: forward and backward colours differ by
    // 56 to 88 per channel, shades of one band by a few units.
    int changes = 0;
    for (int x = static_cast<int>(plotLeft + plotWidth * 0.25) + 1;
         x < static_cast<int>(plotLeft + plotWidth * 0.75); ++x) {
      const QColor a = image.pixelColor(x, y), b = image.pixelColor(x - 1, y);
      changes += std::max({std::abs(a.red() - b.red()), std::abs(a.green() - b.green()),
                           std::abs(a.blue() - b.blue())}) > 24;
    }
    QVERIFY2(changes < 20, qPrintable(QString::number(changes)));
    // A window of a few passes draws them one by one again: forward and backward alternate.
    t.showWindow(sim.step_seconds * 0.5, sim.step_seconds * 0.01);
    const QImage window = t.grab().toImage();
    // ... and the legend no longer speaks of shaded passes (the sends may still be shaded).
    QVERIFY(!t.lastPaintAggregated());
    int passes = 0;
    for (int x = static_cast<int>(plotLeft) + 1; x < static_cast<int>(plotLeft + plotWidth); ++x) {
      const QColor a = window.pixelColor(x, y), b = window.pixelColor(x - 1, y);
      passes += std::max({std::abs(a.red() - b.red()), std::abs(a.green() - b.green()),
                          std::abs(a.blue() - b.blue())}) > 24;
    }
    QVERIFY2(passes >= 6, qPrintable(QString::number(passes)));
  }

  void searchFillsSortsAndLoadsAPlan() {
    if (!SearchView::searchAvailable()) QSKIP("built without the search library");
    MainWindow w(false);
    loadDefault(w);
    SearchView* view = w.searchView();
    QSignalSpy finished(view, &SearchView::searchFinished);
    view->startSearch();
    QVERIFY(view->isRunning());
    QVERIFY(finished.wait(240000));
    QVERIFY(!view->isRunning());
    SearchModel* model = view->model();
    QVERIFY2(model->rowCount() > 1, qPrintable(view->statusText()));
    for (const SearchRow& r : model->rows()) {
      QVERIFY(r.peak_bytes <= r.capacity_bytes);
      QCOMPARE(r.parallel.tp * r.parallel.pp * r.parallel.dp,
               w.session()->scenario().cluster.num_gpus);
    }

    QSortFilterProxyModel* proxy = view->proxy();
    view->table()->sortByColumn(SearchModel::TokensColumn, Qt::DescendingOrder);
    for (int i = 1; i < proxy->rowCount(); ++i) {
      QVERIFY(
          proxy->index(i - 1, SearchModel::TokensColumn).data(SearchModel::SortRole).toDouble() >=
          proxy->index(i, SearchModel::TokensColumn).data(SearchModel::SortRole).toDouble());
    }
    view->table()->sortByColumn(SearchModel::PeakColumn, Qt::AscendingOrder);
    for (int i = 1; i < proxy->rowCount(); ++i) {
      QVERIFY(
          proxy->index(i - 1, SearchModel::PeakColumn).data(SearchModel::SortRole).toLongLong() <=
          proxy->index(i, SearchModel::PeakColumn).data(SearchModel::SortRole).toLongLong());
    }

    // Double-clicking the lowest-memory plan loads its layout into the editor and the plan.
    const QModelIndex first = proxy->index(0, SearchModel::RankColumn);
    const SearchRow chosen =
        model->rows()[static_cast<std::size_t>(proxy->mapToSource(first).row())];
    emit view->table()->doubleClicked(first);
    QVERIFY(w.session()->waitForPlan());
    QVERIFY(w.session()->isValid());
    const ParallelSpec& p = w.session()->scenario().parallel;
    QCOMPARE(p.tp, chosen.parallel.tp);
    QCOMPARE(p.pp, chosen.parallel.pp);
    QCOMPARE(p.dp, chosen.parallel.dp);
    QCOMPARE(p.zero_stage, chosen.parallel.zero_stage);
    QCOMPARE(p.recompute, chosen.parallel.recompute);
    QCOMPARE(p.schedule, chosen.parallel.schedule);
    QCOMPARE(w.session()->scenario().training.micro_batch_size, chosen.micro_batch_size);
    QCOMPARE(w.session()->estimate().memory.peak_reserved_bytes, chosen.peak_bytes);
  }

  void cancelledSearchLeavesTheTableAsItWas() {
    if (!SearchView::searchAvailable()) QSKIP("built without the search library");
    MainWindow w(false);
    loadDefault(w);
    SearchView* view = w.searchView();
    QSignalSpy finished(view, &SearchView::searchFinished);
    view->startSearch();
    QVERIFY(view->isRunning());
    // The answer can only arrive through the event loop, so a cancel before it returns wins.
    view->cancelSearch();
    QVERIFY(!view->isRunning());
    QTest::qWait(3000);  // the worker runs to its end in the background
    QCOMPARE(finished.count(), 0);
    QCOMPARE(view->model()->rowCount(), 0);
    // A new search after a cancel runs normally.
    view->startSearch();
    QVERIFY(finished.wait(240000));
    QVERIFY(view->model()->rowCount() > 0);
  }

  void validationViewShowsPredictedAgainstMeasured() {
    // The default scenario's report (compare(), the CLI's) on a measurement of one rank per stage
    // whose weights are twice the plan's: bars of 1 and 2 times the planned GiB, error +100 %.
    const Scenario s = scenario_from_json(parse_json_text(default_scenario_text()));
    const Estimate e = sim::plan(s);
    backend::Measurement m;
    for (std::size_t st = 0; st < e.memory.stages.size(); ++st) {
      backend::RankMeasurement r;
      r.rank = static_cast<int>(st);
      r.coords.pp = static_cast<int>(st);
      r.memory.peak[static_cast<int>(backend::MemoryTag::weights)] =
          2 * e.memory.stages[st].weights_bytes;
      r.memory.peak_total = 2 * e.memory.stages[st].weights_bytes;
      r.actions.push_back({{sim::Op::forward, 0, 0}, 1e-3});
      r.actions.push_back({{sim::Op::backward, 0, 0}, 2e-3});
      r.step_seconds = 10e-3;
      m.ranks.push_back(r);
    }
    m.losses = {7.0};
    m.skipped = {false};
    const nlohmann::json doc = backend::to_json(backend::compare(s, e, &m, "", {}));
    ValidationView view;
    QVERIFY(view.loadResult(QByteArray::fromStdString(doc.dump())));
    QCOMPARE(view.memoryUnitBytes(), 1024.0 * 1024.0 * 1024.0);  // a 70B model: GiB
    auto* series = qobject_cast<QStackedBarSeries*>(view.chartView()->chart()->series().value(0));
    QVERIFY(series);
    // The planner's categories less the runtime, then the measured temporaries.
    QCOMPARE(series->barSets().size(), static_cast<qsizetype>(kMemoryCategories.size()));
    const QBarSet* weights = series->barSets().at(0);
    QCOMPARE(weights->count(), static_cast<qsizetype>(2 * e.memory.stages.size()));
    for (std::size_t i = 0; i < e.memory.stages.size(); ++i) {
      const double predicted = to_gib(e.memory.stages[i].weights_bytes);
      QCOMPARE(weights->at(static_cast<qsizetype>(2 * i)), predicted);
      QCOMPARE(weights->at(static_cast<qsizetype>(2 * i + 1)), 2 * predicted);
    }
    bool found = false;
    for (int i = 0; i < view.errorTable()->rowCount(); ++i) {
      if (view.errorTable()->item(i, 0)->text() != QStringLiteral("memory/stage 0/weights_bytes"))
        continue;
      found = true;
      QCOMPARE(view.errorTable()->item(i, 1)->data(Qt::DisplayRole).toDouble(), 100.0);
    }
    QVERIFY(found);
    QVERIFY(!view.loadResult("{\"schema\": \"distplan.plan/v1\"}"));
    QVERIFY(!view.loadResult("not json"));
  }

  void chartsExportAsPngAndSvg() {
    MainWindow w(false);
    loadDefault(w);
    w.resize(1280, 800);
    w.show();
    QVERIFY(w.showTab(QStringLiteral("memory")));
    QCoreApplication::processEvents();
    QTemporaryDir dir;
    QString error;
    const QString png = dir.filePath(QStringLiteral("memory.png"));
    QVERIFY2(exportWidget(w.currentChart(), png, &error), qPrintable(error));
    const QImage image(png);
    QVERIFY(!image.isNull());
    QCOMPARE(image.size(), w.currentChart()->size() * w.currentChart()->devicePixelRatio());
    QVERIFY(colourStats(image).second > 10);
    if (!svgExportAvailable()) QSKIP("built without Qt SVG");
    const QString svg = dir.filePath(QStringLiteral("memory.svg"));
    QVERIFY2(exportWidget(w.currentChart(), svg, &error), qPrintable(error));
    QFile file(svg);
    QVERIFY(file.open(QIODevice::ReadOnly));
    const QByteArray text = file.readAll();
    QVERIFY(text.contains("<svg"));
    QVERIFY(text.contains("Stage 0"));
  }
};

QTEST_MAIN(ViewsTest)
#include "views_test.moc"
