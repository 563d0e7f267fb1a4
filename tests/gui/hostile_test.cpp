// distplan-gui under hostile and extreme use (issue 18, items 3 and 5): the command line fails
// cleanly without a display or with absurd sizes and endless files; planning and simulation run
// on workers with stale answers dropped; the timeline's painting is bounded by pixels, not passes.
#include <QElapsedTimer>
#include <QProcess>
#include <QTemporaryDir>
#include <QThread>
#include <QtTest>
#include <nlohmann/json.hpp>

#include "distplan/planner/scenario_json.h"
#include "guitestutil.h"
#include "mainwindow.h"
#include "plansession.h"
#include "timelinewidget.h"

using namespace distplan;
using namespace distplan::gui;
using namespace distplan::gui::test;

namespace {

struct Run {
  int exitCode = -1;
  QProcess::ExitStatus status = QProcess::CrashExit;
  QByteArray out;
  QByteArray err;
};

/// Runs distplan-gui with `args`; `platform` empty: no QT_QPA_PLATFORM and no DISPLAY at all.
Run runGui(const QStringList& args, const QString& platform) {
  QProcess p;
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.remove(QStringLiteral("DISPLAY"));
  env.remove(QStringLiteral("WAYLAND_DISPLAY"));
  env.remove(QStringLiteral("QT_QPA_PLATFORM"));
  if (!platform.isEmpty()) env.insert(QStringLiteral("QT_QPA_PLATFORM"), platform);
  p.setProcessEnvironment(env);
  p.start(QStringLiteral(DISTPLAN_GUI_EXE), args);
  Run r;
  if (!p.waitForFinished(120000)) {
    p.kill();
    p.waitForFinished();
    return r;
  }
  r.exitCode = p.exitCode();
  r.status = p.exitStatus();
  r.out = p.readAllStandardOutput();
  r.err = p.readAllStandardError();
  return r;
}

/// A synthetic step of `stages` rows with `passes` forward and backward blocks spread over it,
/// and a transfer after every forward (the shape pp 64, m 4096 gives).
TimelineData syntheticTimeline(int stages, long long passes) {
  TimelineData d;
  d.num_stages = stages;
  d.labels = {QStringLiteral("forward (compute)"), QStringLiteral("send (p2p)")};
  const long long perStage = passes / stages;
  const double slot = 1e-6;
  d.step_seconds = static_cast<double>(perStage) * 3 * slot;
  d.blocks.reserve(static_cast<std::size_t>(passes * 3));
  for (int s = 0; s < stages; ++s) {
    for (long long i = 0; i < perStage; ++i) {
      const double t = static_cast<double>(i) * 3 * slot;
      const int mb = static_cast<int>(i);
      d.blocks.push_back({s, BlockKind::forward, mb, 0, t, t + slot, 0});
      d.blocks.push_back({s, BlockKind::backward, mb, 0, t + slot, t + 3 * slot, 0});
      d.blocks.push_back({s, BlockKind::communication, mb, 0, t + slot, t + 1.5 * slot, 1});
    }
  }
  return d;
}

}  // namespace

class HostileTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void helpAndVersionNeedNoDisplay() {
    for (const QString& platform : {QString(), QStringLiteral("no-such-platform")}) {
      const Run help = runGui({QStringLiteral("--help")}, platform);
      QCOMPARE(help.status, QProcess::NormalExit);
      QCOMPARE(help.exitCode, 0);
      QVERIFY(help.out.contains("--scenario"));
      // The usage line names the program, not Qt's placeholder.
      QVERIFY2(help.out.contains("Usage: distplan-gui"), help.out.constData());
      QVERIFY(!help.out.contains("<executable_name>"));
      // --help-all lists Qt's own options too: it needs an application object, not a display.
      const Run helpAll = runGui({QStringLiteral("--help-all")}, platform);
      QCOMPARE(helpAll.status, QProcess::NormalExit);
      QCOMPARE(helpAll.exitCode, 0);
      QVERIFY2(helpAll.out.contains("Usage: distplan-gui"), helpAll.out.constData());
      QVERIFY(helpAll.out.contains("--scenario"));
      QVERIFY2(helpAll.out.contains("-platform"), helpAll.out.constData());
      const Run version = runGui({QStringLiteral("--version")}, platform);
      QCOMPARE(version.status, QProcess::NormalExit);
      QCOMPARE(version.exitCode, 0);
      QVERIFY(version.out.contains("distplan-gui"));
      // Qt's own options, as --help-all lists them, are left to Qt, not refused.
      const Run qtOptions = runGui({QStringLiteral("-platform"), QStringLiteral("offscreen"),
                                    QStringLiteral("-style=fusion"), QStringLiteral("--version")},
                                   platform);
      QCOMPARE(qtOptions.status, QProcess::NormalExit);
      QCOMPARE(qtOptions.exitCode, 0);
      QVERIFY2(qtOptions.out.contains("distplan-gui"), qtOptions.err.constData());
      const Run bad = runGui({QStringLiteral("--no-such-option")}, platform);
      QCOMPARE(bad.status, QProcess::NormalExit);
      QCOMPARE(bad.exitCode, 2);
    }
  }

  void absurdSizesAreRefused() {
    for (const QString& size :
         {QStringLiteral("100000x100000"), QStringLiteral("0x0"), QStringLiteral("-5x10"),
          QStringLiteral("99999999999x1"), QStringLiteral("800"), QStringLiteral("axb")}) {
      const Run r = runGui({QStringLiteral("--screenshot"), QStringLiteral("/dev/null"),
                            QStringLiteral("--size"), size},
                           QString());
      QCOMPARE(r.status, QProcess::NormalExit);
      QCOMPARE(r.exitCode, 2);
      QVERIFY2(r.err.contains("--size"), r.err.constData());
    }
  }

  void badTimelineWindowsAreRefused() {
    for (const QString& window :
         {QStringLiteral("5:5"), QStringLiteral("-1:3"), QStringLiteral("3"), QStringLiteral("a:b"),
          QStringLiteral("10:2"), QStringLiteral("0:inf")}) {
      const Run r = runGui({QStringLiteral("--screenshot"), QStringLiteral("/dev/null"),
                            QStringLiteral("--timeline-window"), window},
                           QString());
      QCOMPARE(r.status, QProcess::NormalExit);
      QCOMPARE(r.exitCode, 2);
      QVERIFY2(r.err.contains("--timeline-window"), r.err.constData());
    }
  }

  void endlessAndOddFilesAreRefused() {
    QTemporaryDir dir;
    for (const QString& path :
         {QStringLiteral("/dev/zero"), dir.path(), dir.filePath(QStringLiteral("missing.json"))}) {
      QElapsedTimer clock;
      clock.start();
      const Run r = runGui({QStringLiteral("--scenario"), path}, QStringLiteral("offscreen"));
      QCOMPARE(r.status, QProcess::NormalExit);
      QCOMPARE(r.exitCode, 2);
      QVERIFY2(r.err.contains(path.toUtf8()), r.err.constData());
      qInfo("--scenario %s: exit 2 after %lld ms", qPrintable(path), clock.elapsed());
    }
    const Run r = runGui({QStringLiteral("--scenario"), QStringLiteral("/dev/zero")},
                         QStringLiteral("offscreen"));
    QVERIFY2(r.err.contains("16 MiB"), r.err.constData());
  }

  // Planning runs on a worker: setDocument returns before the answer; of two documents set in a
  // row only the second's plan is ever applied.
  void stalePlansAreDropped() {
    MainWindow w(false);
    loadDefault(w);
    nlohmann::json a = w.editor()->document();
    nlohmann::json b = a;
    a["training"]["global_batch_size"] = 256;
    b["training"]["global_batch_size"] = 1024;
    std::vector<Count> applied;
    connect(w.session(), &PlanSession::planChanged, this,
            [&] { applied.push_back(w.session()->scenario().training.global_batch_size); });
    w.session()->setDocument(a);
    QVERIFY(w.session()->isPlanning());
    w.session()->setDocument(b);
    QVERIFY(w.session()->waitForPlan());
    QVERIFY(!applied.empty());
    for (Count batch : applied) QCOMPARE(batch, Count{1024});
    QCOMPARE(w.session()->scenario().training.global_batch_size, Count{1024});
  }

  // The simulation runs on a worker: the UI thread keeps turning while it runs, and a simulation
  // for a document that changed is never shown.
  void simulationRunsOffTheUiThread() {
    if (!PlanSession::simulatorAvailable()) QSKIP("built without the simulator");
    MainWindow w(false);
    loadDefault(w);
    w.session()->simulateNow();
    QVERIFY(w.session()->hasSimulation());
    const double before = w.session()->simulation().step_seconds;
    nlohmann::json doc = w.editor()->document();
    doc["training"]["global_batch_size"] = 4096;  // 2048 micro-batches per pipeline
    int simulations = 0;
    connect(w.session(), &PlanSession::simulationChanged, this, [&] { ++simulations; });
    w.session()->setDocument(doc);
    QVERIFY(w.session()->waitForPlan());
    QElapsedTimer clock;
    clock.start();
    w.session()->simulateNow();
    qInfo("simulation of %lld micro-batches x pp %lld: %lld ms on a worker",
          static_cast<long long>(w.session()->estimate().num_microbatches),
          static_cast<long long>(w.session()->scenario().parallel.pp), clock.elapsed());
    QCOMPARE(simulations, 1);
    QVERIFY(w.session()->simulation().step_seconds > before);
  }

  // Painting 2^20 passes on 64 stages draws at most one rectangle per pixel column per lane.
  void hugeTimelinePaintsPerPixel() {
    const int stages = 64;
    const long long passes = 1LL << 20;
    TimelineWidget t;
    t.resize(1200, 700);
    QElapsedTimer build;
    build.start();
    t.setTimeline(syntheticTimeline(stages, passes));
    const qint64 indexMs = build.elapsed();
    QElapsedTimer clock;
    clock.start();
    const QImage image = t.grab().toImage();
    const qint64 paintMs = clock.elapsed();
    const long long painted = t.lastPaintedBlocks();
    const int plotWidth = t.width() - 80 - 12;  // the widget's left and right margins
    qInfo("%lld blocks on %d stages: index %lld ms, paint %lld ms, %lld rectangles", passes * 3,
          stages, indexMs, paintMs, painted);
    QVERIFY(painted > 0);
    // Two lanes per stage, each at most one rectangle per pixel column (plus the one partly in).
    QVERIFY2(painted <= 2LL * stages * (plotWidth + 2), qPrintable(QString::number(painted)));
    QVERIFY(painted < passes);
    QVERIFY(colourStats(image).second > 4);

    // Zoomed in to a few blocks, each is drawn on its own.
    t.zoom(20000, 0);
    (void)t.grab();
    const long long zoomed = t.lastPaintedBlocks();
    QVERIFY(zoomed > 0);
    QVERIFY(zoomed <= 2LL * stages * (plotWidth + 2));
  }

  // A handful of wide blocks: every one is drawn (culling only merges what is under a pixel).
  void smallTimelineDrawsEveryBlock() {
    TimelineWidget t;
    t.resize(1200, 500);
    const TimelineData d = syntheticTimeline(4, 40);
    t.setTimeline(d);
    (void)t.grab();
    QCOMPARE(t.lastPaintedBlocks(), static_cast<long long>(d.blocks.size()));
  }
};

QTEST_MAIN(HostileTest)
#include "hostile_test.moc"
