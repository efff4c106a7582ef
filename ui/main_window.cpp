// MainWindow's layout and wiring: the chat column, the side panels, the
// connections between the chat, the engine and the window, and the window's
// own events. The other concerns are in main_window_*.cpp.
#include "main_window.h"

#include <QCloseEvent>
#include <QDockWidget>
#include <QFileInfo>
#include <QMimeData>
#include <QProgressDialog>
#include <QResizeEvent>
#include <QSettings>
#include <QStackedWidget>
#include <QStatusBar>
#include <QVBoxLayout>

#include "batch_sweep_panel.h"
#include "chat_composer.h"
#include "chat_session.h"
#include "chat_view.h"
#include "compare_window.h"
#include "conversation_list.h"
#include "engine_controller.h"
#include "metrics_dock.h"
#include "serving_inputs.h"
#include "serving_lab_window.h"
#include "status_bar_labels.h"
#include "welcome_page.h"

namespace phaselab::ui {

MainWindow::MainWindow(const Options& options, QWidget* parent) : QMainWindow(parent), m_options(options) {
  setWindowTitle(QStringLiteral("PhaseLab"));
  setObjectName(QStringLiteral("mainWindow"));
  setAcceptDrops(true);
  m_settings = AppSettings::load();

  const QString dbPath = options.dbPath.isEmpty() ? ConversationStore::defaultPath() : options.dbPath;
  m_engine = new EngineController(this);
  m_chat = new ChatSession(&m_store, m_engine, this);
  m_chat->setGenerationSettings(m_settings.generation);

  QVBoxLayout* column = createCentral();
  // The list needs the store open: open it first.
  openStore(dbPath, column);
  createDocks();
  m_statusLabels = new StatusBarLabels(statusBar(), this, !m_store.isPersistent());
  m_serveStatus = tr("Not serving.");

  connectChat();
  connectEngine();
  createMenus();
  setUpHardwarePeaks(options.measureHardware);
  restoreWindow();
  applyConversationSettings(m_chat->conversationSettings());

  m_conversations->refresh();
  if (options.autoLoadLastModel && m_settings.useRemote && !m_settings.remote.url.isEmpty())
    connectRemote(m_settings.remote);
  else if (options.autoLoadLastModel && !m_settings.lastModel.isEmpty() && QFileInfo::exists(m_settings.lastModel))
    loadModel(m_settings.lastModel);
  updateWelcome();
  m_composer->focusEditor();
}

MainWindow::~MainWindow() {
  // Before m_store closes (members go before the child objects).
  m_chat->flush();
}

QVBoxLayout* MainWindow::createCentral() {
  auto* central = new QWidget;
  auto* column = new QVBoxLayout(central);
  column->setContentsMargins(4, 4, 4, 4);
  createBanners(column);
  m_pages = new QStackedWidget;
  m_chatPage = new QWidget;
  auto* chatColumn = new QVBoxLayout(m_chatPage);
  chatColumn->setContentsMargins(0, 0, 0, 0);
  createChatToolbar(chatColumn);
  m_chatView = new ChatView;
  chatColumn->addWidget(m_chatView, 1);
  m_composer = new ChatComposer;
  chatColumn->addWidget(m_composer);
  m_pages->addWidget(m_chatPage);
  m_welcomePage = new WelcomePage;
  connect(m_welcomePage, &WelcomePage::openFileRequested, this, &MainWindow::openModelDialog);
  connect(m_welcomePage, &WelcomePage::loadRequested, this, &MainWindow::loadModel);
  m_pages->addWidget(m_welcomePage);
  column->addWidget(m_pages, 1);
  setCentralWidget(central);
  return column;
}

// The conversation list on the left, the metrics on the right (one column of
// tabs in a narrow window: updateDockLayout).
void MainWindow::createDocks() {
  m_conversations = new ConversationList(&m_store);
  m_listDock = new QDockWidget(tr("Conversations"), this);
  m_listDock->setObjectName(QStringLiteral("conversationsDock"));
  m_listDock->setWidget(m_conversations);
  m_listDock->setFeatures(QDockWidget::DockWidgetMovable | QDockWidget::DockWidgetClosable);
  addDockWidget(Qt::LeftDockWidgetArea, m_listDock);
  m_metrics = new MetricsDock(this);
  addDockWidget(Qt::RightDockWidgetArea, m_metrics);
  syncChatToolbar();  // the dock's speculative panel shows the restored setting as the toolbar does
}

// All of these are GUI-thread objects; the thread hop happens inside
// EngineController.
void MainWindow::connectChat() {
  connect(m_composer, &ChatComposer::sendRequested, this, &MainWindow::sendMessage);
  connect(m_composer, &ChatComposer::stopRequested, m_chat, &ChatSession::stop);
  connect(m_conversations, &ConversationList::conversationSelected, m_chat, &ChatSession::openConversation);
  connect(m_conversations, &ConversationList::newConversationRequested, m_chat, &ChatSession::newConversation);
  connect(m_conversations, &ConversationList::conversationDeleted, this, [this](qint64 id) {
    if (id == m_chat->conversationId()) m_chat->newConversation();
  });
  connect(m_chat, &ChatSession::conversationSettingsChanged, this, &MainWindow::applyConversationSettings);
  connect(m_chat, &ChatSession::conversationOpened, this, [this](qint64 id, const QList<MessageRecord>& messages) {
    m_chatView->setMessages(messages);
    m_metrics->showConversation(id, messages);  // the charts are this conversation's
    m_conversations->setCurrent(id);
    updateWelcome();
    m_composer->focusEditor();
  });
  connect(m_chat, &ChatSession::conversationsChanged, this, [this] {
    m_conversations->refresh();
    m_conversations->setCurrent(m_chat->conversationId());
  });
  connect(m_chat, &ChatSession::messageAdded, m_chatView, &ChatView::addMessage);
  connect(m_chat, &ChatSession::messageRemoved, m_chatView, &ChatView::removeMessage);
  connect(m_chat, &ChatSession::messageEdited, m_chatView, &ChatView::editMessage);
  connect(m_chat, &ChatSession::answerDelta, m_chatView, &ChatView::appendToMessage);
  connect(m_chat, &ChatSession::reasoningDelta, m_chatView, &ChatView::appendReasoning);
  connect(m_chat, &ChatSession::answerFinished, m_chatView, &ChatView::finishMessage);
  connect(m_chat, &ChatSession::errorOccurred, this, &MainWindow::showError);
  connect(m_chatView, &ChatView::regenerateRequested, this, &MainWindow::regenerateMessage);
  connect(m_chatView, &ChatView::editRequested, this, &MainWindow::editMessage);
}

void MainWindow::connectEngine() {
  connect(m_engine, &EngineController::errorOccurred, this, &MainWindow::showError);
  connect(m_engine, &EngineController::metricsUpdated, m_metrics, &MetricsDock::updateMetrics);
  connect(m_engine, &EngineController::busyChanged, this, &MainWindow::onBusyChanged);
  connect(m_engine, &EngineController::modelLoaded, this, &MainWindow::onModelLoaded);
  connect(m_engine, &EngineController::serverStarted, this, &MainWindow::onServerStarted);
  connect(m_engine, &EngineController::serverStopped, this, &MainWindow::onServerStopped);
  connect(m_engine, &EngineController::serverFailed, this, &MainWindow::onServerFailed);
  connect(m_engine, &EngineController::modelLoadStarted, this, &MainWindow::onModelLoadStarted);
  connect(m_engine, &EngineController::modelLoadFailed, this, [this](const QString&) { onModelLoadEnded(false); });
  connect(m_engine, &EngineController::modelLoadCancelled, this, [this] { onModelLoadEnded(true); });
  connect(m_engine, &EngineController::modelUnloaded, this, [this] {
    m_statusLabels->setModelText(tr("No model"));
    setWindowTitle(QStringLiteral("PhaseLab"));
    syncChatToolbar();
    updateWelcome();
    updateBaseModelNote();
  });
}

// The geometry and docks of the last session; 1280x800 the first time.
void MainWindow::restoreWindow() {
  QSettings s;
  restoreGeometry(s.value(QStringLiteral("window/geometry")).toByteArray());
  restoreState(s.value(QStringLiteral("window/state")).toByteArray());
  if (!s.contains(QStringLiteral("window/geometry"))) resize(1280, 800);
}

void MainWindow::resizeEvent(QResizeEvent* e) {
  QMainWindow::resizeEvent(e);
  updateDockLayout();
  if (m_statusLabels) m_statusLabels->fit();
}

void MainWindow::updateDockLayout() {
  const bool narrow = width() < kNarrowWidth;
  if (narrow == m_narrow || !m_listDock || !m_metrics) return;
  m_narrow = narrow;
  if (narrow) {
    // One column of side panels as tabs, the metrics in front: the chat keeps
    // about two thirds of an 800 px window.
    tabifyDockWidget(m_metrics, m_listDock);
    m_metrics->raise();
    resizeDocks({m_metrics}, {std::max(m_metrics->minimumWidth(), width() * 34 / 100)}, Qt::Horizontal);
  } else {
    addDockWidget(Qt::LeftDockWidgetArea, m_listDock);
    resizeDocks({m_listDock, m_metrics}, {220, 380}, Qt::Horizontal);
  }
}

CompareWindow* MainWindow::compareWindow() {
  if (!m_compare) {
    m_compare = new CompareWindow(&m_store, this);
    // A sweep that measured the machine the window's way updates the window's peaks.
    connect(m_compare->batchSweep(), &BatchSweepPanel::machinePeaksMeasured, this, &MainWindow::setMachinePeaks);
  }
  // A model is loaded: offer it as the first variant.
  if (m_compare->variantCount() == 0 && m_engine->hasModel() && !m_engine->modelInfo().remote)
    m_compare->addModel(m_engine->modelInfo().path);
  return m_compare;
}

ServingLabWindow* MainWindow::servingLabWindow() {
  if (!m_servingLab) m_servingLab = new ServingLabWindow(&m_store, this);
  // A model is loaded: the lab serves it unless another was chosen.
  if (m_servingLab->inputs()->model().isEmpty() && m_engine->hasModel() && !m_engine->modelInfo().remote)
    m_servingLab->inputs()->setModel(m_engine->modelInfo().path);
  return m_servingLab;
}

void MainWindow::onBusyChanged(bool busy) {
  m_composer->setBusy(busy);
  m_chatView->setBusy(busy);
}

void MainWindow::updateWelcome() {
  const bool welcome = !m_engine->hasModel() && !m_engine->isLoading() && m_chat->messages().isEmpty();
  if (welcome) m_welcomePage->refresh();
  m_pages->setCurrentWidget(welcome ? static_cast<QWidget*>(m_welcomePage) : m_chatPage);
}

bool MainWindow::isWelcomeShown() const { return m_pages->currentWidget() == m_welcomePage; }

void MainWindow::closeEvent(QCloseEvent* e) {
  QSettings s;
  s.setValue(QStringLiteral("window/geometry"), saveGeometry());
  s.setValue(QStringLiteral("window/state"), saveState());
  m_chat->stop();
  m_chat->flush();
  QMainWindow::closeEvent(e);
}

// A .gguf dropped on the window is loaded.
void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
  for (const QUrl& u : e->mimeData()->urls())
    if (u.isLocalFile() && u.toLocalFile().endsWith(QLatin1String(".gguf"), Qt::CaseInsensitive)) {
      e->acceptProposedAction();
      return;
    }
}

void MainWindow::dropEvent(QDropEvent* e) {
  for (const QUrl& u : e->mimeData()->urls())
    if (u.isLocalFile() && u.toLocalFile().endsWith(QLatin1String(".gguf"), Qt::CaseInsensitive)) {
      loadModel(u.toLocalFile());
      e->acceptProposedAction();
      return;
    }
}

}  // namespace phaselab::ui
