#include "mainwindow.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QSaveFile>
#include <QScrollArea>
#include <QSettings>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QVBoxLayout>
#include <nlohmann/json.hpp>

#include "chartexport.h"
#include "communicationview.h"
#include "distplan/planner/error.h"
#include "distplan/planner/input_file.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "memoryview.h"
#include "plansession.h"
#include "scenarioeditor.h"
#include "searchmodel.h"
#include "searchview.h"
#include "summaryview.h"
#include "timelineview.h"
#include "timelinewidget.h"
#include "validationview.h"

#include <QChartView>

namespace distplan::gui {

namespace {
constexpr int kMaxRecentFiles = 8;
const QString kErrorBannerStyle =
    QStringLiteral("background: #fdecea; color: #b00020; padding: 6px; border: 1px solid #f5c2c0;");
const QString kInfoBannerStyle =
    QStringLiteral("background: #e8f0fe; color: #1a3e72; padding: 6px; border: 1px solid #b6c8ee;");
}  // namespace

MainWindow::MainWindow(bool persistent, QWidget* parent)
    : QMainWindow(parent), persistent_(persistent) {
  session_ = new PlanSession(this);
  editor_ = new ScenarioEditor;
  auto* scroll = new QScrollArea;
  scroll->setWidget(editor_);
  scroll->setWidgetResizable(true);
  scroll->setMinimumWidth(340);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);

  tabs_ = new QTabWidget;
  summary_ = new SummaryView;
  memory_ = new MemoryView;
  communication_ = new CommunicationView;
  timeline_ = new TimelineView;
  search_ = new SearchView;
  validation_ = new ValidationView;
  tabs_->addTab(summary_, tr("Summary"));
  tabs_->addTab(memory_, tr("Memory"));
  tabs_->addTab(communication_, tr("Communication"));
  tabs_->addTab(timeline_, tr("Timeline"));
  tabs_->addTab(search_, tr("Search"));
  tabs_->addTab(validation_, tr("Validation"));

  banner_ = new QLabel;
  banner_->setObjectName(QStringLiteral("banner"));
  banner_->setWordWrap(true);
  banner_->setStyleSheet(kErrorBannerStyle);
  banner_->hide();
  auto* right = new QWidget;
  auto* rightLayout = new QVBoxLayout(right);
  rightLayout->setContentsMargins(0, 0, 0, 0);
  rightLayout->addWidget(banner_);
  rightLayout->addWidget(tabs_, 1);

  splitter_ = new QSplitter(Qt::Horizontal);
  splitter_->addWidget(scroll);
  splitter_->addWidget(right);
  splitter_->setStretchFactor(0, 0);
  splitter_->setStretchFactor(1, 1);
  splitter_->setSizes({380, 1000});
  setCentralWidget(splitter_);

  connect(editor_, &ScenarioEditor::edited, this, &MainWindow::editorEdited);
  connect(session_, &PlanSession::planChanged, this, &MainWindow::planChanged);
  connect(session_, &PlanSession::planInvalid, this, &MainWindow::planInvalid);
  connect(session_, &PlanSession::simulationChanged, this, &MainWindow::simulationChanged);
  connect(summary_, &SummaryView::suggestionChosen, this, [this](int index) {
    const auto& suggestions = summary_->suggestions();
    if (!session_->hasPlan() || index < 0 || index >= static_cast<int>(suggestions.size())) return;
    editor_->applyScenario(session_->scenario(),
                           suggestions[static_cast<std::size_t>(index)].scenario);
  });
  connect(search_, &SearchView::planChosen, this, [this](int row) {
    const auto& rows = search_->model()->rows();
    if (row < 0 || row >= static_cast<int>(rows.size())) return;
    const SearchRow& chosen = rows[static_cast<std::size_t>(row)];
    if (isSearchDocument(editor_->document()) || !session_->hasPlan()) {
      // The file's candidate lists give way to the chosen layout; its search object stays.
      std::vector<std::pair<QString, nlohmann::json>> values;
      const nlohmann::json parallel = to_json(chosen.parallel);
      for (const auto& [key, value] : parallel.items()) {
        if (key != "layers_per_stage") {
          values.emplace_back(QStringLiteral("/parallel/") + QString::fromStdString(key), value);
        }
      }
      values.emplace_back(QStringLiteral("/training/micro_batch_size"),
                          nlohmann::json(chosen.micro_batch_size));
      editor_->editValues(values);
    } else {
      Scenario s = session_->scenario();
      s.parallel = chosen.parallel;
      s.training.micro_batch_size = chosen.micro_batch_size;
      editor_->applyScenario(session_->scenario(), s);
    }
    statusBar()->showMessage(tr("Loaded plan #%1 from the search").arg(chosen.rank), 5000);
    showTab(QStringLiteral("summary"));
  });

  createMenus();
  setWindowTitle(tr("distplan"));
  resize(1400, 900);
  if (persistent_) {
    QSettings settings;
    restoreGeometry(settings.value(QStringLiteral("window/geometry")).toByteArray());
    restoreState(settings.value(QStringLiteral("window/state")).toByteArray());
    splitter_->restoreState(settings.value(QStringLiteral("window/splitter")).toByteArray());
    tabs_->setCurrentIndex(settings.value(QStringLiteral("window/tab"), 0).toInt());
    recentFiles_ = settings.value(QStringLiteral("recentFiles")).toStringList();
    updateRecentMenu();
  }
}

QStringList MainWindow::tabNames() {
  return {QStringLiteral("summary"),  QStringLiteral("memory"), QStringLiteral("communication"),
          QStringLiteral("timeline"), QStringLiteral("search"), QStringLiteral("validation")};
}

bool MainWindow::showTab(const QString& name) {
  const int index = static_cast<int>(tabNames().indexOf(name.toLower()));
  if (index < 0) return false;
  tabs_->setCurrentIndex(index);
  return true;
}

QWidget* MainWindow::currentChart() const {
  QWidget* w = tabs_->currentWidget();
  if (w == memory_) return memory_->chartView();
  if (w == communication_) return communication_->chartView();
  if (w == timeline_) return timeline_->timeline();
  if (w == search_) return search_->chartView();
  if (w == validation_) return validation_->chartView();
  return w;
}

QString MainWindow::bannerText() const {
  return banner_->isHidden() ? QString() : banner_->text();
}

void MainWindow::createMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* fresh =
      file->addAction(tr("&New (default scenario)"), this, &MainWindow::loadDefaultScenario);
  fresh->setShortcut(QKeySequence::New);
  QAction* open = file->addAction(tr("&Open scenario…"), this, &MainWindow::openDialog);
  open->setShortcut(QKeySequence::Open);
  recentMenu_ = file->addMenu(tr("Open &recent"));
  QAction* save = file->addAction(tr("&Save scenario"), this, [this] { saveDialog(false); });
  save->setShortcut(QKeySequence::Save);
  QAction* saveAs = file->addAction(tr("Save scenario &as…"), this, [this] { saveDialog(true); });
  saveAs->setShortcut(QKeySequence::SaveAs);
  file->addSeparator();
  QAction* exportChart =
      file->addAction(tr("&Export chart (PNG or SVG)…"), this, &MainWindow::exportCurrentChart);
  exportChart->setShortcut(QKeySequence(tr("Ctrl+E")));
  file->addSeparator();
  QAction* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);

  QMenu* edit = menuBar()->addMenu(tr("&Edit"));
  QAction* copy = edit->addAction(tr("&Copy plan JSON"), this, &MainWindow::copyPlanJson);
  copy->setShortcut(QKeySequence(tr("Ctrl+Shift+C")));

  QMenu* view = menuBar()->addMenu(tr("&View"));
  const QStringList names = tabNames();
  for (int i = 0; i < names.size(); ++i) {
    QAction* a = view->addAction(tabs_->tabText(i), this, [this, i] { tabs_->setCurrentIndex(i); });
    a->setShortcut(QKeySequence(QStringLiteral("Ctrl+%1").arg(i + 1)));
  }
}

void MainWindow::loadDefaultScenario() {
  originalText_ = std::string(default_scenario_text());
  editor_->setDocument(parse_json_text(originalText_));
  setCurrentFile({});
  session_->setDocument(editor_->document());
  documentEdited_ = false;
  setWindowModified(false);
}

bool MainWindow::openScenario(const QString& path, QString* error) {
  auto fail = [&](const InputError& e) {
    if (error) {
      *error = tr("%1: %2%3")
                   .arg(path,
                        e.path().empty() ? QString()
                                         : QString::fromStdString(e.path()) + QStringLiteral(": "),
                        QString::fromUtf8(e.what()));
    }
    return false;
  };
  std::string text;
  nlohmann::json doc;
  try {
    text = read_input_file(QFile::encodeName(path).toStdString(), "scenario");
    doc = parse_json_text(text);
    (void)scenario_from_json(doc, {"search"});
  } catch (const InputError& e) {
    // A search document (lists of candidates, a `search` object) opens for the Search tab.
    if (!isSearchDocument(doc)) return fail(e);
    try {
      (void)search_->setDocument(doc);
    } catch (const InputError& searchError) {
      return fail(searchError);
    }
  }
  originalText_ = std::move(text);
  editor_->setDocument(doc);
  setCurrentFile(path);
  addRecentFile(path);
  session_->setDocument(editor_->document());
  documentEdited_ = false;
  setWindowModified(false);
  return true;
}

bool MainWindow::saveScenario(const QString& path, QString* error) {
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly)) {
    if (error) *error = file.errorString();
    return false;
  }
  // Unedited, the file is written back as it was read, byte for byte.
  const std::string text = documentEdited_ ? editor_->document().dump(2) + "\n" : originalText_;
  if (file.write(text.data(), static_cast<qint64>(text.size())) !=
          static_cast<qint64>(text.size()) ||
      !file.commit()) {
    if (error) *error = file.errorString();
    return false;
  }
  originalText_ = text;
  documentEdited_ = false;
  setCurrentFile(path);
  addRecentFile(path);
  setWindowModified(false);
  return true;
}

void MainWindow::openDialog() {
  const QString path =
      QFileDialog::getOpenFileName(this, tr("Open scenario"), QFileInfo(currentFile_).path(),
                                   tr("Scenario JSON (*.json);;All files (*)"));
  if (path.isEmpty()) return;
  QString error;
  if (!openScenario(path, &error)) QMessageBox::warning(this, tr("Open scenario"), error);
}

void MainWindow::saveDialog(bool saveAs) {
  QString path = currentFile_;
  if (saveAs || path.isEmpty()) {
    path = QFileDialog::getSaveFileName(this, tr("Save scenario"),
                                        path.isEmpty() ? QStringLiteral("scenario.json") : path,
                                        tr("Scenario JSON (*.json)"));
    if (path.isEmpty()) return;
  }
  QString error;
  if (!saveScenario(path, &error)) {
    QMessageBox::warning(this, tr("Save scenario"), error);
  } else {
    statusBar()->showMessage(tr("Saved %1").arg(path), 4000);
  }
}

void MainWindow::copyPlanJson() {
  if (!session_->hasPlan()) return;
  QApplication::clipboard()->setText(QString::fromUtf8(session_->planJson()));
  statusBar()->showMessage(tr("Plan JSON copied to the clipboard"), 4000);
}

void MainWindow::exportCurrentChart() {
  exportWidgetWithDialog(this, currentChart(), tabNames().value(tabs_->currentIndex()));
}

void MainWindow::addRecentFile(const QString& path) {
  const QString absolute = QFileInfo(path).absoluteFilePath();
  recentFiles_.removeAll(absolute);
  recentFiles_.prepend(absolute);
  while (recentFiles_.size() > kMaxRecentFiles) recentFiles_.removeLast();
  if (persistent_) QSettings().setValue(QStringLiteral("recentFiles"), recentFiles_);
  updateRecentMenu();
}

void MainWindow::updateRecentMenu() {
  recentMenu_->clear();
  for (const QString& path : std::as_const(recentFiles_)) {
    recentMenu_
        ->addAction(QFileInfo(path).fileName(), this,
                    [this, path] {
                      QString error;
                      if (!openScenario(path, &error))
                        QMessageBox::warning(this, tr("Open scenario"), error);
                    })
        ->setToolTip(path);
  }
  recentMenu_->setEnabled(!recentFiles_.isEmpty());
}

void MainWindow::setCurrentFile(const QString& path) {
  currentFile_ = path;
  setWindowTitle(
      tr("%1[*] — distplan").arg(path.isEmpty() ? tr("untitled") : QFileInfo(path).fileName()));
}

void MainWindow::editorEdited() {
  documentEdited_ = true;
  setWindowModified(true);
  session_->setDocument(editor_->document());
}

void MainWindow::planChanged() {
  editor_->clearError();
  banner_->hide();
  const Scenario& s = session_->scenario();
  editor_->setResolved(s);
  const Estimate& e = session_->estimate();
  summary_->setPlan(s, e, session_->suggestions());
  memory_->setMemory(e.memory);
  communication_->setCommunication(e.communication);
  search_->setBaseScenario(s);
  if (isSearchDocument(session_->document())) {
    try {
      (void)search_->setDocument(session_->document());
    } catch (const InputError&) {
      search_->setDocument(nlohmann::json());  // the plan's message is the one shown
    }
  } else {
    search_->setDocument(nlohmann::json());
  }
  validation_->setScenarioDocument(QByteArray::fromStdString(session_->document().dump(2)));
  if (!PlanSession::simulatorAvailable()) {
    timeline_->setMessage(tr("This build has no simulator."));
  }
}

void MainWindow::planInvalid(const QString& path, const QString& message) {
  // A search document has no single plan; its request drives the Search tab, and its resolved
  // model, cluster and training fill the fields the file leaves out.
  if (isSearchDocument(session_->document())) {
    try {
      search_->setDocument(session_->document());
      editor_->setResolved(*search_->requestBase(), /*withLayout=*/false);
      editor_->clearError();
      banner_->setStyleSheet(kInfoBannerStyle);
      banner_->setText(tr("A search request (%1%2): the Search tab searches its candidates; "
                          "double-click a plan there to plan it here.")
                           .arg(path.isEmpty() ? QString() : path + QStringLiteral(": "), message));
      banner_->show();
      return;
    } catch (const InputError&) {
      search_->setDocument(nlohmann::json());  // the plan's message below is the one shown
    }
  }
  editor_->showError(path, message);
  banner_->setStyleSheet(kErrorBannerStyle);
  banner_->setText(tr("Invalid scenario — %1%2 (the results show the last valid plan)")
                       .arg(path.isEmpty() ? QString() : path + QStringLiteral(": "), message));
  banner_->show();
}

void MainWindow::simulationChanged() {
  if (!session_->hasSimulation()) {
    timeline_->setMessage(session_->errorMessage());
    return;
  }
  const SimulationSummary& sim = session_->simulation();
  timeline_->setTimeline(sim.timeline, sim.bubble_fraction);
}

void MainWindow::closeEvent(QCloseEvent* event) {
  if (persistent_) {
    QSettings settings;
    settings.setValue(QStringLiteral("window/geometry"), saveGeometry());
    settings.setValue(QStringLiteral("window/state"), saveState());
    settings.setValue(QStringLiteral("window/splitter"), splitter_->saveState());
    settings.setValue(QStringLiteral("window/tab"), tabs_->currentIndex());
  }
  event->accept();
}

}  // namespace distplan::gui
