// The Search tab (issue 17, item 11): ZeRO sharding written as `distplan search --format table`
// writes it, the chart's "best" marker on the plan the table ranks first, axes from zero, no
// column cut off at the default window size, and search documents (lists, a `search` object).
#include <algorithm>
#include <sstream>

#include <QChart>
#include <QChartView>
#include <QFile>
#include <QHeaderView>
#include <QScatterSeries>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QTemporaryDir>
#include <QValueAxis>
#include <QtTest>
#include <nlohmann/json.hpp>

#include "categories.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "guitestutil.h"
#include "mainwindow.h"
#include "plansession.h"
#include "searchmodel.h"
#include "searchview.h"
#include "validationview.h"

using namespace distplan;
using namespace distplan::gui;
using namespace distplan::gui::test;
using nlohmann::json;

namespace {

// ZeRO-3 with shard groups smaller than dp (hybrid_shard), lists of candidates, a search object.
const char* kSearchDocument = R"({
  "model": "llama2-7b",
  "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16, "gpus_per_node": 8},
  "training": {"seq_length": 2048, "global_batch_size": 64, "micro_batch_size": [1, 2]},
  "parallel": {"tp": [1, 2], "pp": [1, 2], "zero_stage": [2, 3]},
  "search": {"top_k": 20, "constraints": {"hybrid_shard": true}}
}
)";

bool runSearch(SearchView* view) {
  QSignalSpy finished(view, &SearchView::searchFinished);
  view->startSearch();
  return view->isRunning() && finished.wait(240000) && view->model()->rowCount() > 0;
}

/// The CLI table's `zero` column, by rank (the library's own table, an independent formatter).
std::map<int, QString> cliZeroColumn(const json& doc) {
  const search::Request request = search::request_from_json(doc);
  const search::Result result = search::run(request.space, request.options);
  std::istringstream table(search::format_result_table(request, result));
  std::map<int, QString> zero;
  std::string line;
  // Columns found by their header names, so a column added to the table does not shift them.
  std::size_t rankAt = 0, zeroAt = 0;
  bool inRows = false;
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string x; fields >> x;) f.push_back(x);
    if (!f.empty() && f[0] == "rank") {
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (f[i] == "rank") rankAt = i;
        if (f[i] == "zero") zeroAt = i;
      }
      inRows = zeroAt > 0;
      continue;
    }
    if (!inRows) continue;
    if (f.size() <= std::max(rankAt, zeroAt)) break;  // the blank line after the rows
    zero[std::stoi(f[rankAt])] = QString::fromStdString(f[zeroAt]);
  }
  return zero;
}

}  // namespace

class SearchTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    if (!SearchView::searchAvailable()) QSKIP("built without the search library");
  }

  void searchDocumentOpensAndDrivesTheSearch() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("search.json"));
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(kSearchDocument);
    f.close();
    MainWindow w(false);
    QString error;
    QVERIFY2(w.openScenario(path, &error), qPrintable(error));
    QVERIFY(w.session()->waitForPlan());
    QVERIFY(w.searchView()->hasRequest());
    // Not an error: the banner says what the file is, the fields show the resolved model.
    QVERIFY2(w.bannerText().contains(QStringLiteral("search request")), qPrintable(w.bannerText()));
    QVERIFY(w.editor()->errorText().isEmpty());
    auto* layers = w.editor()->findChild<QLineEdit*>(QStringLiteral("/model/num_layers"));
    QVERIFY(layers);
    QCOMPARE(layers->text(), QStringLiteral("32"));  // llama2-7b
    QVERIFY(runSearch(w.searchView()));
    // Every plan is among the file's candidates.
    for (const SearchRow& r : w.searchView()->model()->rows()) {
      QVERIFY(r.parallel.tp == 1 || r.parallel.tp == 2);
      QVERIFY(r.parallel.pp == 1 || r.parallel.pp == 2);
      QVERIFY(r.parallel.zero_stage == 2 || r.parallel.zero_stage == 3);
      QVERIFY(r.micro_batch_size == 1 || r.micro_batch_size == 2);
    }
    QCOMPARE(w.searchView()->model()->rowCount(), 20);  // the file's top_k
    // Unedited, the search document saves as it was read.
    const QString unedited = dir.filePath(QStringLiteral("unedited.json"));
    QVERIFY2(w.saveScenario(unedited, &error), qPrintable(error));
    QFile u(unedited);
    QVERIFY(u.open(QIODevice::ReadOnly));
    QCOMPARE(u.readAll(), QByteArray(kSearchDocument));

    // Double-clicking the first plan loads its layout: the lists give way, the search object stays.
    const SearchRow chosen = w.searchView()->model()->rows().front();
    emit w.searchView()->table()->doubleClicked(
        w.searchView()->proxy()->mapFromSource(w.searchView()->model()->index(0, 0)));
    QVERIFY(w.session()->waitForPlan());
    QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
    QCOMPARE(w.session()->scenario().parallel.tp, chosen.parallel.tp);
    QCOMPARE(w.session()->scenario().parallel.pp, chosen.parallel.pp);
    QCOMPARE(w.session()->scenario().parallel.zero_stage, chosen.parallel.zero_stage);
    QCOMPARE(w.session()->scenario().training.micro_batch_size, chosen.micro_batch_size);
    QCOMPARE(w.session()->estimate().memory.peak_reserved_bytes, chosen.peak_bytes);
    QVERIFY(w.editor()->document().contains("search"));
  }

  // Two plans that differ only in their pipeline split (the CLI's "light ends" note) differ in
  // the table too, and double-clicking a light-ends plan plans that split, not the even one.
  void lightEndsPlansShowTheirSplitAndPlanAsSearched() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("plan.json"));
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"model": "llama3.1-70b",
      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64, "gpus_per_node": 8},
      "training": {"seq_length": 8192, "global_batch_size": 512, "framework": "megatron"},
      "parallel": {"tp": 8, "pp": 4}})");
    f.close();
    MainWindow w(false);
    QString error;
    QVERIFY2(w.openScenario(path, &error), qPrintable(error));
    QVERIFY(w.session()->waitForPlan());
    QVERIFY(runSearch(w.searchView()));
    const auto& rows = w.searchView()->model()->rows();
    const auto light =
        std::find_if(rows.begin(), rows.end(), [](const SearchRow& r) { return r.light_ends; });
    QVERIFY2(light != rows.end(), "no plan with light ends among the top plans");
    QVERIFY(!w.searchView()->table()->isColumnHidden(SearchModel::SplitColumn));
    const int row = static_cast<int>(light - rows.begin());
    const QModelIndex cell = w.searchView()->model()->index(row, SearchModel::SplitColumn);
    QCOMPARE(cell.data().toString(), QStringLiteral("light ends"));
    QVERIFY(light->parallel.split.rule != SplitRule::even ||
            !light->parallel.layers_per_stage.empty());
    const SearchRow chosen = *light;
    emit w.searchView()->table()->doubleClicked(w.searchView()->proxy()->mapFromSource(cell));
    QVERIFY(w.session()->waitForPlan());
    QVERIFY2(w.session()->isValid(), qPrintable(w.session()->errorMessage()));
    QCOMPARE(w.session()->scenario().parallel.split, chosen.parallel.split);
    QCOMPARE(w.session()->estimate().memory.peak_reserved_bytes, chosen.peak_bytes);
  }

  void zeroShardingIsWrittenAsTheCliWritesIt() {
    const json doc = parse_json_text(kSearchDocument);
    const std::map<int, QString> cli = cliZeroColumn(doc);
    QVERIFY(cli.size() >= 10);
    SearchView view;
    view.setDocument(doc);
    QVERIFY(runSearch(&view));
    int sharded = 0;
    for (const SearchRow& r : view.model()->rows()) {
      const QModelIndex cell = view.model()->index(r.rank - 1, SearchModel::ZeroColumn);
      const QString shown = view.model()->data(cell, Qt::DisplayRole).toString();
      QVERIFY(cli.count(r.rank));
      QCOMPARE(shown, cli.at(r.rank));
      if (shown.contains(QLatin1Char('/'))) ++sharded;
    }
    QVERIFY(sharded > 0);  // the case the old "3 (shard 4)" text got wrong
  }

  void bestMarkerIsTheTablesFirstAndAxesStartAtZero() {
    MainWindow w(false);
    loadDefault(w);
    SearchView* view = w.searchView();
    QVERIFY(runSearch(view));
    const QModelIndex first = view->proxy()->index(0, SearchModel::RankColumn);
    const SearchRow& top =
        view->model()->rows()[static_cast<std::size_t>(view->proxy()->mapToSource(first).row())];
    QCOMPARE(top.rank, 1);
    QScatterSeries* best = nullptr;
    QScatterSeries* others = nullptr;
    for (QAbstractSeries* s : view->chartView()->chart()->series()) {
      if (s->name() == QStringLiteral("best")) best = qobject_cast<QScatterSeries*>(s);
      if (s->name() == QStringLiteral("plans")) others = qobject_cast<QScatterSeries*>(s);
    }
    QVERIFY(best && others);
    QCOMPARE(best->count(), 1);
    QCOMPARE(best->at(0), QPointF(to_gib(top.peak_bytes), top.tokens_per_second));
    QCOMPARE(others->count(), view->model()->rowCount() - 1);
    for (QAbstractAxis* a : view->chartView()->chart()->axes()) {
      auto* axis = qobject_cast<QValueAxis*>(a);
      QVERIFY(axis);
      QCOMPARE(axis->min(), 0.0);
    }
  }

  void noColumnIsCutOffAtTheDefaultSize() {
    MainWindow w(false);
    loadDefault(w);
    // The window's own default size (1400 × 900); --screenshot's default is 1440 × 900.
    QVERIFY(w.showTab(QStringLiteral("search")));
    w.show();
    QVERIFY(runSearch(w.searchView()));
    QCoreApplication::processEvents();
    QTableView* table = w.searchView()->table();
    const QFontMetrics cellFont(table->font());
    const QFontMetrics headerFont(table->horizontalHeader()->font());
    int total = 0;
    for (int c = 0; c < table->model()->columnCount(); ++c) {
      if (table->isColumnHidden(c)) continue;  // cp, v or ep when every plan has 1
      const int width = table->columnWidth(c);
      total += width;
      const QString header = table->model()->headerData(c, Qt::Horizontal).toString();
      QVERIFY2(width >= headerFont.horizontalAdvance(header),
               qPrintable(QStringLiteral("%1: %2 < header").arg(header).arg(width)));
      for (int r = 0; r < table->model()->rowCount(); ++r) {
        const QString text = table->model()->index(r, c).data().toString();
        QVERIFY2(width >= cellFont.horizontalAdvance(text),
                 qPrintable(QStringLiteral("%1 row %2: '%3' wider than %4")
                                .arg(header)
                                .arg(r)
                                .arg(text)
                                .arg(width)));
      }
    }
    QVERIFY2(total <= table->viewport()->width(),
             qPrintable(QStringLiteral("columns %1 px, table %2 px")
                            .arg(total)
                            .arg(table->viewport()->width())));
  }

  // The same on every table of every tab (memory, communication, suggestions, validation).
  void noTableColumnIsCutOffOnAnyTab() {
    MainWindow w(false);
    loadDefault(w);
    w.show();
    w.session()->simulateNow();
    QVERIFY(w.validationView()->openFile(
        QStringLiteral(DISTPLAN_SOURCE_DIR "/data/validation/tiny-gpt-tp2-pp2-dp2.result.json")));
    for (const QString& tab : MainWindow::tabNames()) {
      QVERIFY(w.showTab(tab));
      QCoreApplication::processEvents();
      for (QTableView* table : w.findChildren<QTableView*>()) {
        if (!table->isVisible() || !table->model()) continue;
        const QFontMetrics cellFont(table->font());
        const QFontMetrics headerFont(table->horizontalHeader()->font());
        int total = 0;
        for (int c = 0; c < table->model()->columnCount(); ++c) {
          if (table->isColumnHidden(c)) continue;
          const int width = table->columnWidth(c);
          total += width;
          const QString header = table->model()->headerData(c, Qt::Horizontal).toString();
          QVERIFY2(width >= headerFont.horizontalAdvance(header),
                   qPrintable(QStringLiteral("%1: column '%2' %3 px").arg(tab, header).arg(width)));
          for (int r = 0; r < table->model()->rowCount(); ++r) {
            const QString text = table->model()->index(r, c).data().toString();
            QVERIFY2(width >= cellFont.horizontalAdvance(text),
                     qPrintable(QStringLiteral("%1: '%2' in column '%3' (%4 px)")
                                    .arg(tab, text, header)
                                    .arg(width)));
          }
        }
        QVERIFY2(total <= table->viewport()->width(),
                 qPrintable(QStringLiteral("%1 (%2): columns %3 px, table %4 px")
                                .arg(tab, table->objectName())
                                .arg(total)
                                .arg(table->viewport()->width())));
      }
    }
  }
};

QTEST_MAIN(SearchTest)
#include "search_test.moc"
