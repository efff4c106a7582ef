#include "main_window.h"

#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QDir>
#include <QDockWidget>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QInputDialog>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QPointer>
#include <QProgressDialog>
#include <QPushButton>
#include <QSettings>
#include <QFontMetrics>
#include <QStatusBar>
#include <QThread>
#include <QToolButton>
#include <QCheckBox>
#include <QComboBox>
#include <QRegularExpression>
#include <QResizeEvent>
#include <QSaveFile>
#include <QStackedWidget>
#include <QTimer>
#include <QToolBar>
#include <QVBoxLayout>

#include "appearance.h"
#include "chat_composer.h"
#include "compare_window.h"
#include "conversation_export.h"
#include "conversation_settings_dialog.h"
#include "hardware_probe.h"
#include "phaselab/backend.h"
#include "chat_session.h"
#include "chat_view.h"
#include "conversation_list.h"
#include "engine_controller.h"
#include "message_widget.h"
#include "metrics_dock.h"
#include "phase_meter.h"
#include "model_manager.h"
#include "phaselab/log.h"
#include "settings_dialog.h"
#include "welcome_page.h"
#include "model_fetcher.h"

namespace phaselab::ui {

namespace {
QFrame* makeBanner(QLabel** text, const QColor& color) {
  auto* frame = new QFrame;
  frame->setFrameShape(QFrame::StyledPanel);
  frame->setAutoFillBackground(true);
  QPalette pal = frame->palette();
  pal.setColor(QPalette::Window, color);
  pal.setColor(QPalette::WindowText, Qt::black);
  frame->setPalette(pal);
  auto* l = new QHBoxLayout(frame);
  l->setContentsMargins(8, 4, 4, 4);
  *text = new QLabel;
  (*text)->setWordWrap(true);
  (*text)->setTextInteractionFlags(Qt::TextSelectableByMouse);
  l->addWidget(*text, 1);
  frame->hide();
  return frame;
}
}  // namespace

MainWindow::MainWindow(const Options& options, QWidget* parent) : QMainWindow(parent), m_options(options) {
  setWindowTitle(QStringLiteral("PhaseLab"));
  setObjectName(QStringLiteral("mainWindow"));
  setAcceptDrops(true);
  m_settings = AppSettings::load();

  const QString dbPath = options.dbPath.isEmpty() ? ConversationStore::defaultPath() : options.dbPath;
  m_engine = new EngineController(this);
  m_chat = new ChatSession(&m_store, m_engine, this);
  m_chat->setGenerationSettings(m_settings.generation);

  // Central: banners, chat, composer.
  auto* central = new QWidget;
  auto* col = new QVBoxLayout(central);
  col->setContentsMargins(4, 4, 4, 4);
  m_errorBanner = makeBanner(&m_errorText, QColor(255, 214, 214));
  m_errorBanner->setObjectName(QStringLiteral("errorBanner"));
  auto* dismiss = new QToolButton;
  dismiss->setText(QStringLiteral("✕"));
  dismiss->setToolTip(tr("Dismiss"));
  m_errorBanner->layout()->addWidget(dismiss);
  connect(dismiss, &QToolButton::clicked, this, &MainWindow::clearError);
  col->addWidget(m_errorBanner);
  // A base model (no chat template) is said to be one, with the way to use
  // it well one click away.
  m_baseModelNote = makeBanner(&m_baseModelText, QColor(214, 232, 255));
  m_baseModelNote->setObjectName(QStringLiteral("baseModelNote"));
  auto* notebook = new QPushButton(tr("Use Notebook Mode"));
  notebook->setObjectName(QStringLiteral("useNotebookMode"));
  m_baseModelNote->layout()->addWidget(notebook);
  connect(notebook, &QPushButton::clicked, this, [this] { setConversationMode(QStringLiteral("notebook")); });
  auto* dismissNote = new QToolButton;
  dismissNote->setText(QStringLiteral("✕"));
  dismissNote->setToolTip(tr("Dismiss"));
  dismissNote->setAccessibleName(tr("Dismiss the base model note"));
  m_baseModelNote->layout()->addWidget(dismissNote);
  connect(dismissNote, &QToolButton::clicked, this, [this] {
    m_baseModelNoteDismissed = true;
    updateBaseModelNote();
  });
  col->addWidget(m_baseModelNote);
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
  col->addWidget(m_pages, 1);
  setCentralWidget(central);

  // The list needs the store open: open it first. A database that cannot be
  // used never stops chatting: the conversations live in memory, the file is
  // left as it was, and the window says so until it is fixed.
  m_storeWarning = makeBanner(&m_storeWarningText, QColor(255, 236, 200));
  m_storeWarning->setObjectName(QStringLiteral("storeWarning"));
  auto* moveAside = new QPushButton(tr("Move It Aside and Start Fresh"));
  moveAside->setObjectName(QStringLiteral("moveDatabaseAside"));
  m_storeWarning->layout()->addWidget(moveAside);
  connect(moveAside, &QPushButton::clicked, this, &MainWindow::moveDatabaseAside);
  col->insertWidget(1, m_storeWarning);
  m_dbPath = dbPath;
  if (!m_store.open(dbPath)) {
    const QString why = m_store.lastError();
    spdlog::warn("gui: conversations are not saved: {}", why.toStdString());
    m_storeWarningText->setText(
        tr("<b>Conversations are not being saved.</b> %1. The file %2 was left as it is; chats stay in memory "
           "until you quit. Moving it aside keeps it under a new name.")
            .arg(why.toHtmlEscaped(), dbPath.toHtmlEscaped()));
    m_storeWarning->show();
    m_store.openInMemory();
  }
  m_conversations = new ConversationList(&m_store);
  m_listDock = new QDockWidget(tr("Conversations"), this);
  m_listDock->setObjectName(QStringLiteral("conversationsDock"));
  m_listDock->setWidget(m_conversations);
  m_listDock->setFeatures(QDockWidget::DockWidgetMovable | QDockWidget::DockWidgetClosable);
  addDockWidget(Qt::LeftDockWidgetArea, m_listDock);
  m_metrics = new MetricsDock(this);
  addDockWidget(Qt::RightDockWidgetArea, m_metrics);

  m_modelLabel = new QLabel(tr("No model"));
  m_modelLabel->setObjectName(QStringLiteral("modelLabel"));
  m_notSavedLabel = new QLabel(tr("<b style='color:#b00020'>Not saved</b>"));
  m_notSavedLabel->setObjectName(QStringLiteral("notSavedLabel"));
  m_notSavedLabel->setToolTip(tr("The conversation database cannot be used: chats are kept in memory only."));
  m_notSavedLabel->setVisible(!m_store.isPersistent());
  statusBar()->addPermanentWidget(m_notSavedLabel);
  // The API server's address while it serves (Settings > Servers).
  m_serveLabel = new QLabel;
  m_serveLabel->setObjectName(QStringLiteral("serveLabel"));
  m_serveLabel->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_serveLabel->setToolTip(tr("The loaded model is served over the OpenAI API to programs on this machine. The server "
                              "has its own KV cache (memory) and shares the CPU with the chat. Settings > Servers "
                              "turns it off."));
  m_serveLabel->hide();
  statusBar()->addPermanentWidget(m_serveLabel);
  statusBar()->addPermanentWidget(m_modelLabel);
  m_modelText = m_modelLabel->text();
  connect(statusBar(), &QStatusBar::messageChanged, this, [this] { fitStatusBar(); });
  m_serveStatus = tr("Not serving.");

  // Wiring. All of these are GUI-thread objects; the thread hop happens
  // inside EngineController.
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
  connect(m_chat, &ChatSession::answerFinished, m_chatView, &ChatView::finishMessage);
  connect(m_chat, &ChatSession::errorOccurred, this, &MainWindow::showError);
  connect(m_chatView, &ChatView::regenerateRequested, this, &MainWindow::regenerateMessage);
  connect(m_chatView, &ChatView::editRequested, this, &MainWindow::editMessage);

  connect(m_engine, &EngineController::errorOccurred, this, &MainWindow::showError);
  connect(m_engine, &EngineController::metricsUpdated, m_metrics, &MetricsDock::updateMetrics);
  connect(m_engine, &EngineController::busyChanged, this, &MainWindow::onBusyChanged);
  connect(m_engine, &EngineController::modelLoaded, this, &MainWindow::onModelLoaded);
  connect(m_engine, &EngineController::serverStarted, this, [this](const QString& url) {
    m_serveStatus = tr("Serving at %1").arg(url);
    m_serveLabel->setText(m_serveStatus);
    m_serveLabel->show();
    statusBar()->showMessage(tr("The OpenAI API serves the loaded model at %1").arg(url), 8000);
  });
  connect(m_engine, &EngineController::serverStopped, this, [this] {
    m_serveStatus = tr("Not serving.");
    m_serveLabel->clear();
    m_serveLabel->hide();
  });
  connect(m_engine, &EngineController::serverFailed, this, [this](const QString& error) {
    m_serveStatus = error;
    m_serveLabel->clear();
    m_serveLabel->hide();
    showError(tr("The OpenAI API server did not start: %1").arg(error));
  });
  connect(m_engine, &EngineController::modelLoadStarted, this, [this](const QString& path) {
    m_loadingPath = path;
    // A remote server's URL ends in its API path ("v1"): name the server.
    const bool url = path.contains(QLatin1String("://"));
    const QString what = url ? path : QFileInfo(path).fileName();
    setModelLabel(url ? tr("Connecting to %1…").arg(what) : tr("Loading %1…").arg(what));
    updateWelcome();
    if (!m_loadProgress) {
      // Busy indicator: the load is an mmap plus validation, with no
      // meaningful percentage. Shown only if it takes longer than 300 ms.
      m_loadProgress = new QProgressDialog(this);
      m_loadProgress->setWindowTitle(tr("Loading model"));
      m_loadProgress->setRange(0, 0);
      m_loadProgress->setMinimumDuration(300);
      m_loadProgress->setAutoClose(false);
      m_loadProgress->setAutoReset(false);
      connect(m_loadProgress, &QProgressDialog::canceled, m_engine, &EngineController::cancelLoad);
    }
    m_loadProgress->setLabelText(m_modelText);
    m_loadProgress->reset();
    m_loadProgress->setRange(0, 0);
    m_loadProgress->setValue(0);
  });
  auto endLoad = [this] {
    if (m_loadProgress) m_loadProgress->cancel();
  };
  connect(m_engine, &EngineController::modelLoadFailed, this, [this, endLoad](const QString&) {
    endLoad();
    setModelLabel(tr("No model"));
    syncChatToolbar();
    updateWelcome();
  });
  connect(m_engine, &EngineController::modelLoadCancelled, this, [this, endLoad] {
    endLoad();
    setModelLabel(tr("No model (load cancelled)"));
    updateWelcome();
  });
  connect(m_engine, &EngineController::modelUnloaded, this, [this] {
    setModelLabel(tr("No model"));
    setWindowTitle(QStringLiteral("PhaseLab"));
    syncChatToolbar();
    updateWelcome();
    updateBaseModelNote();
  });

  createMenus();
  connect(m_metrics, &MetricsDock::remeasureRequested, this, &MainWindow::startHardwareProbe);
  // Cached peaks that were doubtful when measured are shown with their
  // reason but never divided by (the meter shows no percentage), and the
  // machine is measured again once the engine is idle.
  const HardwarePeaks cachedPeaks = HardwareProbe::cached();
  m_metrics->setPeaks(cachedPeaks);
  // The first probe waits for the window to settle: a model loading at the
  // same time (page faults on 240 MB of weights) halved the figure.
  if (!cachedPeaks.usable() && options.measureHardware)
    QTimer::singleShot(1000, this, &MainWindow::startHardwareProbe);

  QSettings s;
  restoreGeometry(s.value(QStringLiteral("window/geometry")).toByteArray());
  restoreState(s.value(QStringLiteral("window/state")).toByteArray());
  if (!s.contains(QStringLiteral("window/geometry"))) resize(1280, 800);
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

void MainWindow::createMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* newChat = file->addAction(tr("&New Chat"), m_chat, &ChatSession::newConversation);
  newChat->setShortcut(QKeySequence::New);
  QAction* open = file->addAction(tr("&Open Model…"), this, &MainWindow::openModelDialog);
  open->setShortcut(QKeySequence::Open);
  QAction* models = file->addAction(tr("&Models…"), this, &MainWindow::openModelManager);
  models->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_M));
  QAction* remote = file->addAction(tr("&Remote Server…"), this, [this] { openSettings(true); });
  remote->setObjectName(QStringLiteral("remoteServerAction"));
  remote->setToolTip(tr("Chat with a remote OpenAI-compatible server instead of a local model, or serve the loaded "
                        "model over the OpenAI API"));
  file->addAction(tr("&Unload Model"), m_engine, &EngineController::unloadModel);
  file->addSeparator();
  QAction* exportChat = file->addAction(tr("&Export Conversation…"), this, &MainWindow::exportDialog);
  exportChat->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_E));
  exportChat->setToolTip(tr("Save the open conversation as Markdown (to read) or JSON (to import elsewhere)"));
  file->addAction(tr("&Import Conversations…"), this, &MainWindow::importDialog);
  file->addSeparator();
  QAction* compare = file->addAction(tr("&Compare Models…"), this, [this] {
    compareWindow()->show();
    compareWindow()->raise();
    compareWindow()->activateWindow();
  });
  compare->setObjectName(QStringLiteral("compareAction"));
  compare->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_K));
  compare->setToolTip(tr("Models and quantizations side by side: speed, memory, perplexity, KL divergence"));
  file->addSeparator();
  // The main toolbar: what a person reaches for first.
  QToolBar* mainBar = addToolBar(tr("Main"));
  mainBar->setObjectName(QStringLiteral("mainToolbar"));
  mainBar->setMovable(false);
  mainBar->addAction(newChat);
  mainBar->addAction(open);
  mainBar->addAction(models);
  mainBar->addAction(compare);
  QAction* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);

  QMenu* chat = menuBar()->addMenu(tr("&Chat"));
  QAction* send = chat->addAction(tr("&Send"), this, [this] { sendMessage(m_composer->text()); });
  send->setShortcuts({QKeySequence(Qt::CTRL | Qt::Key_Return), QKeySequence(Qt::CTRL | Qt::Key_Enter)});
  QAction* stop = chat->addAction(tr("S&top"), m_chat, &ChatSession::stop);
  stop->setShortcut(QKeySequence(Qt::Key_Escape));
  stop->setShortcutContext(Qt::WindowShortcut);
  QAction* regen = chat->addAction(tr("&Regenerate"), m_chat, &ChatSession::regenerate);
  regen->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_R));
  QAction* copy = chat->addAction(tr("&Copy Last Answer"), this, [this] {
    const auto& msgs = m_chat->messages();
    for (auto it = msgs.rbegin(); it != msgs.rend(); ++it)
      if (it->role == QLatin1String("assistant")) {
        QApplication::clipboard()->setText(it->content);
        break;
      }
  });
  copy->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_C));
  chat->addSeparator();
  QAction* convSettings = chat->addAction(tr("Conversation &Settings…"), this, &MainWindow::openConversationSettings);
  convSettings->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_S));
  QAction* notebookMode = chat->addAction(tr("&Notebook Mode"));
  notebookMode->setObjectName(QStringLiteral("notebookModeAction"));
  notebookMode->setCheckable(true);
  notebookMode->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_N));
  connect(notebookMode, &QAction::toggled, this, [this](bool on) {
    setConversationMode(on ? QStringLiteral("notebook") : QStringLiteral("chat"));
  });
  connect(m_chat, &ChatSession::conversationSettingsChanged, notebookMode, [notebookMode](const ConversationSettings& s) {
    const QSignalBlocker block(notebookMode);
    notebookMode->setChecked(s.mode == QLatin1String("notebook"));
  });

  QMenu* view = menuBar()->addMenu(tr("&View"));
  for (QDockWidget* d : findChildren<QDockWidget*>()) view->addAction(d->toggleViewAction());
  view->addSeparator();
  QMenu* theme = view->addMenu(tr("&Theme"));
  auto* themes = new QActionGroup(theme);
  for (const auto& [t, label] : {std::pair{Theme::System, tr("&System")}, std::pair{Theme::Light, tr("&Light")},
                                 std::pair{Theme::Dark, tr("&Dark")}}) {
    QAction* a = theme->addAction(label, this, [t = t] { applyTheme(t); });
    a->setCheckable(true);
    a->setChecked(Appearance::instance()->theme() == t);
    a->setObjectName(QStringLiteral("theme-") + themeName(t));
    themes->addAction(a);
  }
  QAction* bigger = view->addAction(tr("&Larger Text"), this, [] { increaseFontSize(); });
  // Ctrl+= as well as Ctrl++: on most layouts + needs Shift.
  bigger->setShortcuts({QKeySequence(Qt::CTRL | Qt::Key_Equal), QKeySequence(Qt::CTRL | Qt::Key_Plus)});
  QAction* smaller = view->addAction(tr("&Smaller Text"), this, [] { decreaseFontSize(); });
  smaller->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Minus));
  QAction* reset = view->addAction(tr("&Actual Size"), this, [] { resetFontSize(); });
  reset->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_0));

  QMenu* settings = menuBar()->addMenu(tr("&Settings"));
  QAction* prefs = settings->addAction(tr("&Preferences…"), this, [this] { openSettings(); });
  prefs->setShortcut(QKeySequence::Preferences);
  if (prefs->shortcut().isEmpty()) prefs->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Comma));
  QAction* reprobe = settings->addAction(tr("Measure This Machine Again"), this, &MainWindow::startHardwareProbe);
  reprobe->setToolTip(tr("Memory bandwidth and compute peak used by the phase meter"));

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  help->addAction(tr("&About PhaseLab"), this, [this] {
    QMessageBox::about(this, tr("About PhaseLab"),
                       tr("<b>PhaseLab %1</b><p>Run language models locally and see how inference works: "
                          "prefill (compute-bound, seen as time to first token) and decode (memory-bound, "
                          "seen as tokens per second).</p><p>Log file: %2</p>")
                           .arg(QApplication::applicationVersion(), QString::fromStdString(log_file_path())));
  });
}

void MainWindow::loadModel(const QString& path) {
  clearError();
  // Opening a local model is choosing it over a remote server, for the next
  // start too.
  if (m_settings.useRemote) {
    m_settings.useRemote = false;
    m_settings.save();
  }
  m_loadedConfig = m_settings.engine;
  m_engine->loadModel(path, m_settings.engine);
}

void MainWindow::connectRemote(const RemoteConfig& remote) {
  clearError();
  m_engine->connectRemote(remote);
}

QString MainWindow::serveLabelText() const { return m_serveLabel->isVisibleTo(this) ? m_serveLabel->text() : QString(); }

void MainWindow::setServeSettings(bool serve, int port) {
  const bool changed = serve != m_settings.serve || port != m_settings.servePort;
  m_settings.serve = serve;
  m_settings.servePort = port;
  m_settings.save();
  if (changed || serve != m_engine->isServing()) applyServeSettings();
}

void MainWindow::applyServeSettings() {
  const bool local = m_engine->hasModel() && !m_engine->modelInfo().remote;
  if (m_settings.serve && local) {
    m_engine->startServer(m_settings.servePort);  // a running one is stopped first
  } else {
    if (m_engine->isServing())
      m_engine->stopServer();  // serverStopped says so
    else
      m_serveStatus = tr("Not serving.");  // not an earlier failure's message
    if (m_settings.serve && m_engine->hasModel())
      m_serveStatus = tr("Not serving: the chat is connected to a remote server; serving needs a local model.");
    else if (m_settings.serve)
      m_serveStatus = tr("Not serving yet: PhaseLab serves the model once one is loaded.");
  }
}

bool MainWindow::sendMessage(const QString& text) {
  if (text.trimmed().isEmpty()) return false;
  clearError();
  if (!m_chat->send(text)) return false;
  m_composer->clear();
  return true;
}

void MainWindow::setGenerationSettings(const GenerationSettings& g) {
  m_settings.generation = g;
  m_chat->setGenerationSettings(g);
  syncChatToolbar();
}

void MainWindow::applyGenerationSettings(const GenerationSettings& g) {
  setGenerationSettings(g);
  m_settings.save();
}

void MainWindow::createChatToolbar(QVBoxLayout* column) {
  // A row of plain widgets rather than a QToolBar: a toolbar hides what does
  // not fit behind an overflow button, and these must stay in sight.
  auto* bar = new QWidget;
  bar->setObjectName(QStringLiteral("chatToolbar"));
  auto* row = new QHBoxLayout(bar);
  row->setContentsMargins(2, 0, 2, 0);
  row->setSpacing(6);

  m_modeCombo = new QComboBox;
  m_modeCombo->setObjectName(QStringLiteral("modeCombo"));
  m_modeCombo->setAccessibleName(tr("Conversation mode"));
  m_modeCombo->addItem(tr("Chat"), QStringLiteral("chat"));
  m_modeCombo->addItem(tr("Notebook"), QStringLiteral("notebook"));
  m_modeCombo->setToolTip(tr("Chat: questions and answers through the chat template.\nNotebook: the model continues "
                             "your text as written, the way to use a base model."));
  row->addWidget(m_modeCombo);
  connect(m_modeCombo, &QComboBox::currentIndexChanged, this,
          [this] { setConversationMode(m_modeCombo->currentData().toString()); });

  m_kvToggle = new QCheckBox(tr("KV cache"));
  m_kvToggle->setObjectName(QStringLiteral("kvToggle"));
  m_kvToggle->setAccessibleName(tr("KV cache"));
  row->addWidget(m_kvToggle);
  connect(m_kvToggle, &QCheckBox::toggled, this, [this](bool on) {
    GenerationSettings g = m_settings.generation;
    if (g.useKvCache == on) return;
    g.useKvCache = on;
    applyGenerationSettings(g);
  });

  auto* specLabel = m_specLabel = new QLabel(tr("Speculative:"));
  row->addWidget(specLabel);
  m_specCombo = new QComboBox;
  m_specCombo->setObjectName(QStringLiteral("specCombo"));
  m_specCombo->setAccessibleName(tr("Speculative decoding"));
  specLabel->setBuddy(m_specCombo);
  m_specCombo->addItem(tr("off"), QString::fromLatin1(to_string(SpeculativeMode::off)));
  m_specCombo->addItem(tr("prompt lookup"), QString::fromLatin1(to_string(SpeculativeMode::prompt_lookup)));
  m_specCombo->addItem(tr("draft model"), QString::fromLatin1(to_string(SpeculativeMode::draft_model)));
  row->addWidget(m_specCombo);
  connect(m_specCombo, &QComboBox::currentIndexChanged, this, [this] {
    GenerationSettings g = m_settings.generation;
    const QString mode = m_specCombo->currentData().toString();
    if (g.speculative == mode) return;
    g.speculative = mode;
    applyGenerationSettings(g);
  });

  auto* conv = new QToolButton;
  conv->setObjectName(QStringLiteral("conversationSettingsButton"));
  conv->setText(tr("Settings…"));
  conv->setToolTip(tr("This conversation's mode, system prompt and chat template (Ctrl+Shift+S)"));
  conv->setAccessibleName(tr("Conversation settings"));
  row->addWidget(conv);
  connect(conv, &QToolButton::clicked, this, &MainWindow::openConversationSettings);
  row->addStretch(1);
  column->addWidget(bar);
  syncChatToolbar();
}

void MainWindow::syncChatToolbar() {
  if (!m_kvToggle) return;
  const QSignalBlocker a(m_kvToggle), b(m_specCombo);
  m_kvToggle->setChecked(m_settings.generation.useKvCache);
  m_specCombo->setCurrentIndex(std::max(0, m_specCombo->findData(m_settings.generation.speculative)));
  // A remote server keeps its own KV cache and decides how it decodes: these
  // apply to a local model only (they are not sent).
  const bool remote = m_engine->hasModel() && m_engine->modelInfo().remote;
  for (QWidget* w : {static_cast<QWidget*>(m_kvToggle), static_cast<QWidget*>(m_specLabel),
                     static_cast<QWidget*>(m_specCombo)})
    w->setEnabled(!remote);
  const QString remoteTip = tr("The remote server runs its own KV cache and decoding: this applies to a local model.");
  m_kvToggle->setToolTip(remote ? remoteTip
                                : tr("Off: every token recomputes the whole conversation. Watch decode tokens/s drop."));
  m_specCombo->setToolTip(remote ? remoteTip
                                 : tr("Draft tokens cheaply, verify them in one pass of the model. The answer is the "
                                      "same (greedy) or has the same distribution (sampling); the metrics dock shows "
                                      "acceptance."));
}

void MainWindow::applyConversationSettings(const ConversationSettings& s) {
  const bool notebook = s.mode == QLatin1String("notebook");
  {
    const QSignalBlocker block(m_modeCombo);
    m_modeCombo->setCurrentIndex(std::max(0, m_modeCombo->findData(s.mode)));
  }
  m_composer->setNotebookMode(notebook);
  m_chatView->setRoleLabels(notebook ? tr("Text") : tr("You"), notebook ? tr("Continuation") : tr("Assistant"));
  updateBaseModelNote();
}

void MainWindow::setConversationMode(const QString& mode) {
  ConversationSettings s = m_chat->conversationSettings();
  if (s.mode == mode) return;
  s.mode = mode;
  if (!m_chat->setConversationSettings(s)) applyConversationSettings(m_chat->conversationSettings());
  // A new conversation after this one starts in the same mode.
  ConversationSettings next;
  next.mode = mode;
  m_chat->setDefaultConversationSettings(next);
  if (!m_chat->messages().isEmpty()) m_chat->openConversation(m_chat->conversationId());  // relabel the cards
}

void MainWindow::openConversationSettings() {
  const QString modelTemplate = m_engine->hasModel() ? m_engine->modelInfo().chatTemplate : QString();
  ConversationSettingsDialog dlg(m_chat->conversationSettings(), modelTemplate,
                                 m_settings.generation.systemPrompt, this);
  if (dlg.exec() != QDialog::Accepted) return;
  const QString before = m_chat->conversationSettings().mode;
  m_chat->setConversationSettings(dlg.settings());
  if (before != dlg.settings().mode && !m_chat->messages().isEmpty()) m_chat->openConversation(m_chat->conversationId());
}

void MainWindow::updateBaseModelNote() {
  const bool base = m_engine->hasModel() && !m_engine->modelInfo().hasChatTemplate;
  const bool notebook = m_chat->conversationSettings().mode == QLatin1String("notebook");
  if (base)
    m_baseModelText->setText(
        tr("<b>%1 is a base model</b>: it has no chat template and was not trained to answer. Chat gives it "
           "three example exchanges first; Notebook mode, where it continues your text, suits it best.")
            .arg(m_engine->modelInfo().name.toHtmlEscaped()));
  m_baseModelNote->setVisible(base && !notebook && !m_baseModelNoteDismissed);
}

bool MainWindow::isBaseModelNoteShown() const { return m_baseModelNote->isVisibleTo(this); }

void MainWindow::resizeEvent(QResizeEvent* e) {
  QMainWindow::resizeEvent(e);
  updateDockLayout();
  fitStatusBar();
}

void MainWindow::setModelLabel(const QString& text) {
  m_modelText = text;
  fitStatusBar();
}

void MainWindow::fitStatusBar() {
  if (!m_modelLabel) return;
  const QString message = statusBar()->currentMessage();
  const QFontMetrics fm(m_modelLabel->font());
  const int whole = fm.horizontalAdvance(m_modelText);
  int room = whole;
  if (!message.isEmpty()) {
    int others = 0;  // the other permanent labels, and the gaps between the parts
    for (QLabel* l : {m_notSavedLabel, m_serveLabel})
      if (l->isVisibleTo(this)) others += l->sizeHint().width() + 8;
    room = statusBar()->width() - others - QFontMetrics(statusBar()->font()).horizontalAdvance(message) - 40;
  }
  const bool elided = room < whole;
  m_modelLabel->setText(elided ? fm.elidedText(m_modelText, Qt::ElideRight, std::max(room, fm.horizontalAdvance(QStringLiteral("M…")))) : m_modelText);
  m_modelLabel->setToolTip(elided ? m_modelText : QString());
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
  if (!m_compare) m_compare = new CompareWindow(&m_store, this);
  // A model is loaded: offer it as the first variant.
  if (m_compare->variantCount() == 0 && m_engine->hasModel() && !m_engine->modelInfo().remote)
    m_compare->addModel(m_engine->modelInfo().path);
  return m_compare;
}

bool MainWindow::exportConversation(const QString& path) {
  if (m_chat->conversationId() == 0) {
    showError(tr("Nothing to export yet: this conversation has no messages."));
    return false;
  }
  m_chat->flush();
  const bool markdown = path.endsWith(QLatin1String(".md"), Qt::CaseInsensitive) ||
                        path.endsWith(QLatin1String(".markdown"), Qt::CaseInsensitive);
  const QByteArray data = markdown ? exportMarkdown(&m_store, m_chat->conversationId()).toUtf8()
                                   : phaselab::ui::exportConversation(&m_store, m_chat->conversationId());
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly) || f.write(data) != data.size() || !f.commit()) {
    showError(tr("Could not write %1: %2. Choose another folder.").arg(path, f.errorString()));
    return false;
  }
  statusBar()->showMessage(tr("Exported to %1").arg(path), 5000);
  return true;
}

bool MainWindow::importConversations(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) {
    showError(tr("Could not read %1: %2").arg(path, f.errorString()));
    return false;
  }
  if (f.size() > conversation_export::kMaxFileBytes) {
    showError(tr("%1 is larger than %2 MiB: not a PhaseLab conversation export.")
                  .arg(path).arg(conversation_export::kMaxFileBytes >> 20));
    return false;
  }
  QString error;
  QList<qint64> ids;
  const qint64 first = importJson(&m_store, f.readAll(), &error, &ids);
  if (first == 0) {
    showError(tr("Could not import %1: %2").arg(QFileInfo(path).fileName(), error));
    return false;
  }
  m_conversations->refresh();
  m_chat->openConversation(first);
  statusBar()->showMessage(tr("Imported %n conversation(s) from %1", "", ids.size()).arg(QFileInfo(path).fileName()), 5000);
  return true;
}

void MainWindow::exportDialog() {
  if (m_chat->conversationId() == 0) {
    showError(tr("Nothing to export yet: this conversation has no messages."));
    return;
  }
  const QString title = m_store.conversation(m_chat->conversationId()).title;
  QString base = title.left(40).replace(QRegularExpression(QStringLiteral("[^\\w\\- ]")), QString()).trimmed();
  if (base.isEmpty()) base = QStringLiteral("conversation");
  const QString path = QFileDialog::getSaveFileName(this, tr("Export conversation"), QDir::home().filePath(base + QStringLiteral(".md")),
                                                    tr("Markdown (*.md);;PhaseLab JSON (*.json)"));
  if (path.isEmpty()) return;
  exportConversation(path);
}

void MainWindow::importDialog() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Import conversations"), QDir::homePath(),
                                                    tr("PhaseLab JSON (*.json);;All files (*)"));
  if (!path.isEmpty()) importConversations(path);
}

void MainWindow::setEngineConfig(const EngineConfig& e) { m_settings.engine = e; }

bool MainWindow::isErrorShown() const { return m_errorBanner->isVisibleTo(const_cast<MainWindow*>(this)); }

void MainWindow::showError(const QString& message) {
  // Errors are shown, never fatal: the window stays usable.
  m_lastError = message;
  m_errorText->setText(message);
  m_errorBanner->show();
  statusBar()->showMessage(message, 8000);
  spdlog::warn("gui: {}", message.toStdString());
}

void MainWindow::clearError() { m_errorBanner->hide(); }

void MainWindow::onModelLoaded(const ModelInfo& info) {
  if (m_loadProgress) m_loadProgress->cancel();
  if (info.remote) {
    spdlog::info("gui: connected to {} ({})", info.remoteUrl.toStdString(), info.remoteModel.toStdString());
    setModelLabel(tr("%1 · remote at %2").arg(info.name, info.remoteUrl));
    setWindowTitle(QStringLiteral("PhaseLab — %1 (remote)").arg(info.name));
    m_metrics->setModel(info);
    updateBaseModelNote();
    syncChatToolbar();
    statusBar()->showMessage(tr("Connected to %1 at %2").arg(info.name, info.remoteUrl), 5000);
    applyServeSettings();  // says why it does not serve, if it is asked to
    updateWelcome();
    emit modelReady();
    return;
  }
  spdlog::info("gui: loaded model {} ({}, {} backend)", info.path.toStdString(), info.name.toStdString(),
               info.backend.toStdString());
  setModelLabel(tr("%1 · %2 · %3").arg(info.name, info.backend, info.typeMix));
  setWindowTitle(QStringLiteral("PhaseLab — %1").arg(info.name));
  m_metrics->setModel(info);
  updateBaseModelNote();
  syncChatToolbar();
  // The phase meter divides by the peaks of the device doing the work: the
  // GPU's from its properties, else this machine's measured CPU peaks.
  if (info.backend == QLatin1String("cuda")) {
    const CudaProbe gpu = probe_cuda();
    HardwarePeaks peaks;
    peaks.memoryBandwidth = gpu.peak_gbps * 1e9;
    peaks.peakFlops = gpu.peak_tflops * 1e12;
    if (peaks.valid()) m_metrics->setPeaks(peaks);
  } else {
    m_metrics->setPeaks(HardwareProbe::cached());
  }
  if (m_options.rememberModel) {
    m_settings.lastModel = info.path;
    QSettings().setValue(QStringLiteral("model/last"), info.path);
  }
  statusBar()->showMessage(tr("Loaded %1 (%2 parameters, %3)")
                               .arg(info.name, ModelManager::formatParams(info.nParams), info.typeMix),
                           5000);
  // The engine stopped the server of the previous model: serve this one.
  applyServeSettings();
  updateWelcome();
  emit modelReady();
}

void MainWindow::moveDatabaseAside() {
  QString error;
  m_chat->stop();
  m_store.close();
  const QString aside = ConversationStore::moveAside(m_dbPath, &error);
  if (aside.isEmpty() || !m_store.open(m_dbPath)) {
    if (aside.isEmpty()) error = error.isEmpty() ? m_store.lastError() : error;
    else error = m_store.lastError();
    m_store.openInMemory();
    showError(tr("Still not saving: %1").arg(error));
  } else {
    m_storeWarning->hide();
    statusBar()->showMessage(tr("The old database is kept as %1; new conversations are saved.").arg(aside), 10000);
    spdlog::info("gui: moved the conversation database aside to {}", aside.toStdString());
  }
  m_notSavedLabel->setVisible(!m_store.isPersistent());
  m_chat->newConversation();
  m_conversations->refresh();
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

bool MainWindow::isStoreWarningShown() const { return m_storeWarning->isVisibleTo(this); }

bool MainWindow::isNotSavedShown() const { return m_notSavedLabel->isVisibleTo(this); }

bool MainWindow::isWelcomeShown() const { return m_pages->currentWidget() == m_welcomePage; }

void MainWindow::openModelDialog() {
  // The dialog starts in the model folder, made if it does not exist yet.
  const QString dir = QString::fromStdString(user_model_dir());
  QDir().mkpath(dir);
  const QString path = QFileDialog::getOpenFileName(this, tr("Open a GGUF model"), dir,
                                                    tr("GGUF models (*.gguf);;All files (*)"));
  if (!path.isEmpty()) loadModel(path);
}

void MainWindow::openModelManager() {
  ModelManager dlg(QString::fromStdString(user_model_dir()), m_engine->modelInfo(), m_engine->hasModel(), this);
  connect(&dlg, &ModelManager::loadRequested, this, &MainWindow::loadModel);
  connect(&dlg, &ModelManager::unloadRequested, m_engine, &EngineController::unloadModel);
  dlg.exec();
}

void MainWindow::openSettings(bool serversPage) {
  // A remote server has no engine settings to reload for.
  const bool remoteLoaded = m_engine->hasModel() && m_engine->modelInfo().remote;
  SettingsDialog dlg(m_settings, m_loadedConfig, m_engine->hasModel() && !remoteLoaded, this);
  // The server's state, kept current while the dialog is open.
  dlg.setServeStatus(m_serveStatus);
  if (serversPage) dlg.showServersPage();
  for (auto signal : {&EngineController::serverStarted, &EngineController::serverFailed})
    connect(m_engine, signal, &dlg, [this, &dlg] { dlg.setServeStatus(m_serveStatus); });
  connect(m_engine, &EngineController::serverStopped, &dlg, [this, &dlg] { dlg.setServeStatus(m_serveStatus); });
  if (dlg.exec() != QDialog::Accepted) return;
  const bool reload = dlg.needsReload();
  const AppSettings before = m_settings;
  m_settings = dlg.settings();
  m_settings.save();
  m_chat->setGenerationSettings(m_settings.generation);
  syncChatToolbar();
  const RemoteConfig& r = m_settings.remote;
  const bool remoteChanged = r.url != before.remote.url || r.apiKey != before.remote.apiKey || r.model != before.remote.model;
  if (m_settings.useRemote && !r.url.isEmpty() && (!remoteLoaded || remoteChanged)) {
    connectRemote(r);  // the server is applied again once connected (onModelLoaded)
    return;
  }
  if (m_settings.useRemote && r.url.isEmpty()) {
    showError(tr("A remote server needs its URL (Settings > Servers), e.g. http://127.0.0.1:8000/v1."));
    return;
  }
  if (!m_settings.useRemote && remoteLoaded) {
    // Back to a local model: the last one, if there is one.
    if (!m_settings.lastModel.isEmpty() && QFileInfo::exists(m_settings.lastModel))
      loadModel(m_settings.lastModel);
    else
      m_engine->unloadModel();
    return;
  }
  if (reload) {
    loadModel(m_engine->modelInfo().path);  // serving resumes once it is loaded
    return;
  }
  if (m_settings.serve != before.serve || m_settings.servePort != before.servePort ||
      m_settings.serve != m_engine->isServing())
    applyServeSettings();
}

void MainWindow::regenerateMessage(qint64 id) {
  const auto& msgs = m_chat->messages();
  if (msgs.isEmpty() || msgs.back().id != id) {
    statusBar()->showMessage(tr("Only the last answer can be regenerated; use Edit on a question to branch."), 5000);
    return;
  }
  clearError();
  m_chat->regenerate();
}

void MainWindow::editMessage(qint64 id) {
  const MessageWidget* w = m_chatView->messageWidget(id);
  if (!w) return;
  bool ok = false;
  const QString text = QInputDialog::getMultiLineText(
      this, tr("Edit message"), tr("The answers after this message will be replaced:"), w->text(), &ok);
  if (ok) m_chat->editAndResend(id, text);
}

void MainWindow::startHardwareProbe() {
  if (m_probing) return;
  if (m_engine->isBusy() || m_engine->isLoading()) {
    // A load or an answer would share the cores and the memory bus with the
    // probe and lower every figure: measure once the engine is idle.
    m_metrics->phaseMeter()->setMeasuring(true);
    statusBar()->showMessage(tr("The machine will be measured once the engine is idle."), 5000);
    m_probeWaiting = true;
    if (!m_probeRetryConnected) {
      m_probeRetryConnected = true;
      auto retry = [this] {
        if (!m_probeWaiting || m_engine->isBusy() || m_engine->isLoading()) return;
        m_probeWaiting = false;
        QTimer::singleShot(300, this, &MainWindow::startHardwareProbe);
      };
      connect(m_engine, &EngineController::busyChanged, this, retry);
      connect(m_engine, &EngineController::modelLoaded, this, retry);
      connect(m_engine, &EngineController::modelLoadFailed, this, retry);
      connect(m_engine, &EngineController::modelLoadCancelled, this, retry);
    }
    return;
  }
  m_probing = true;
  m_metrics->phaseMeter()->setMeasuring(true);
  statusBar()->showMessage(tr("Measuring this machine's memory bandwidth and compute peaks…"));
  QPointer<MainWindow> self(this);
  QThread* t = QThread::create([self] {
    const HardwarePeaks peaks = HardwareProbe::measure();
    QMetaObject::invokeMethod(qApp, [self, peaks] {
      HardwareProbe::store(peaks);
      if (!self) return;
      self->m_probing = false;
      self->m_metrics->phaseMeter()->setMeasuring(false);
      // A GPU model keeps the GPU's peaks; the CPU's are stored for later.
      if (!self->m_engine->hasModel() || self->m_engine->modelInfo().backend != QLatin1String("cuda"))
        self->m_metrics->setPeaks(peaks);
      self->statusBar()->showMessage(
          tr("Measured: memory reads %1 GB/s on %n thread(s)", "", peaks.threads).arg(peaks.memoryBandwidth / 1e9, 0, 'f', 1),
          8000);
    }, Qt::QueuedConnection);
  });
  connect(t, &QThread::finished, t, &QObject::deleteLater);
  t->start(QThread::LowPriority);
}

void MainWindow::closeEvent(QCloseEvent* e) {
  QSettings s;
  s.setValue(QStringLiteral("window/geometry"), saveGeometry());
  s.setValue(QStringLiteral("window/state"), saveState());
  m_chat->stop();
  m_chat->flush();
  QMainWindow::closeEvent(e);
}

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
