// Every tab renders offscreen at 1280x800 or more into a picture that is not blank, both in
// process and through the command line (--scenario, --tab, --screenshot).
#include <QImage>
#include <QProcess>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>

#include "guitestutil.h"
#include "mainwindow.h"
#include "plansession.h"
#include "searchview.h"
#include "validationview.h"

using namespace distplan::gui;
using namespace distplan::gui::test;

namespace {
// A picture is "not blank" when no single colour covers most of it and it has the many colours
// of text, bars and antialiasing (a blank or single-box window has a handful).
constexpr double kMaxDominantShare = 0.9;
constexpr std::size_t kMinColours = 40;
}  // namespace

class ScreenshotTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void everyTabRendersANonBlankPicture_data() {
    QTest::addColumn<QString>("tab");
    for (const QString& name : MainWindow::tabNames()) QTest::newRow(qPrintable(name)) << name;
  }

  void everyTabRendersANonBlankPicture() {
    QFETCH(QString, tab);
    MainWindow w(false);
    loadDefault(w);
    w.resize(1280, 800);
    QVERIFY(w.showTab(tab));
    w.show();
    w.session()->simulateNow();
    if (tab == QLatin1String("validation")) {  // the checked-in CPU result of tiny-gpt
      QVERIFY(w.validationView()->openFile(
          QStringLiteral(DISTPLAN_SOURCE_DIR "/data/validation/tiny-gpt-tp2-pp2-dp2.result.json")));
    }
    if (tab == QLatin1String("search") && SearchView::searchAvailable()) {
      QSignalSpy finished(w.searchView(), &SearchView::searchFinished);
      w.searchView()->startSearch();
      QVERIFY(finished.wait(240000));
    }
    QCoreApplication::processEvents();
    const QImage image = w.grab().toImage();
    QVERIFY(image.width() >= 1280 && image.height() >= 800);
    // The tab's own area (right of the editor) must carry the picture, not only the editor.
    const QWidget* current = w.currentChart();
    const QRect area(current->mapTo(&w, QPoint(0, 0)), current->size());
    const auto [share, colours] = colourStats(image.copy(area));
    QVERIFY2(share < kMaxDominantShare,
             qPrintable(QStringLiteral("dominant colour %1").arg(share)));
    QVERIFY2(colours >= kMinColours, qPrintable(QStringLiteral("%1 colours").arg(colours)));
    QTemporaryDir dir;
    QVERIFY(image.save(dir.filePath(tab + QStringLiteral(".png"))));
  }

  void commandLineWritesAScreenshotAndExits() {
    QTemporaryDir dir;
    const QString out = dir.filePath(QStringLiteral("memory.png"));
    QProcess process;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    process.setProcessEnvironment(env);
    process.start(
        QStringLiteral(DISTPLAN_GUI_EXE),
        {QStringLiteral("--scenario"),
         QStringLiteral(DISTPLAN_SOURCE_DIR "/docs/screenshots/llama2-70b-64xh100.json"),
         QStringLiteral("--tab"), QStringLiteral("memory"), QStringLiteral("--screenshot"), out});
    QVERIFY(process.waitForFinished(120000));
    QCOMPARE(process.exitStatus(), QProcess::NormalExit);
    QVERIFY2(process.exitCode() == 0, process.readAllStandardError().constData());
    const QImage image(out);
    QVERIFY(!image.isNull());
    QVERIFY(image.width() >= 1280 && image.height() >= 800);
    QVERIFY(colourStats(image).first < kMaxDominantShare);
    QVERIFY(colourStats(image).second >= kMinColours);
  }

  void commandLineRejectsAnUnknownTab() {
    QProcess process;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    process.setProcessEnvironment(env);
    process.start(QStringLiteral(DISTPLAN_GUI_EXE),
                  {QStringLiteral("--tab"), QStringLiteral("nonsense"),
                   QStringLiteral("--screenshot"), QStringLiteral("/dev/null")});
    QVERIFY(process.waitForFinished(60000));
    QCOMPARE(process.exitCode(), 2);
    QVERIFY(process.readAllStandardError().contains("nonsense"));
  }
};

QTEST_MAIN(ScreenshotTest)
#include "screenshot_test.moc"
