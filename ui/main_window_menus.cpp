// MainWindow's menus, its main toolbar and the chat toolbar above the chat.
#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QClipboard>
#include <QDockWidget>
#include <QMenuBar>
#include <QMessageBox>
#include <QToolBar>
#include <QVBoxLayout>

#include "appearance.h"
#include "chat_composer.h"
#include "chat_session.h"
#include "chat_toolbar.h"
#include "compare_window.h"
#include "engine_controller.h"
#include "get_models_dialog.h"
#include "main_window.h"
#include "metrics_dock.h"
#include "phaselab/log.h"
#include "serving_lab_window.h"

namespace phaselab::ui {

void MainWindow::createMenus() {
  createFileMenu();
  createChatMenu();
  createViewMenu();
  createSettingsAndHelpMenus();
}

// File, and the main toolbar: what a person reaches for first.
void MainWindow::createFileMenu() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* newChat = file->addAction(tr("&New Chat"), m_chat, &ChatSession::newConversation);
  newChat->setShortcut(QKeySequence::New);
  QAction* open = file->addAction(tr("&Open Model…"), this, &MainWindow::openModelDialog);
  open->setShortcut(QKeySequence::Open);
  QAction* models = file->addAction(tr("&Models…"), this, &MainWindow::openModelManager);
  models->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_M));
  // Non-modal, so that a download can run while the chat is used; closing
  // it pauses the download (Download resumes it).
  QAction* getModels = file->addAction(tr("&Get Models…"), this, [this] {
    auto* dlg = findChild<GetModelsDialog*>(QString(), Qt::FindDirectChildrenOnly);
    if (!dlg) {
      dlg = new GetModelsDialog(QString::fromStdString(user_model_dir()), this);
      dlg->setAttribute(Qt::WA_DeleteOnClose);
      connect(dlg, &GetModelsDialog::modelDownloaded, this, &MainWindow::loadModel);
    }
    dlg->show();
    dlg->raise();
    dlg->activateWindow();
  });
  getModels->setObjectName(QStringLiteral("getModelsAction"));
  getModels->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_G));
  getModels->setToolTip(tr("Search Hugging Face for GGUF models and download one into the model folder"));
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
  QAction* lab = file->addAction(tr("&Serving Lab…"), this, [this] {
    servingLabWindow()->show();
    servingLabWindow()->raise();
    servingLabWindow()->activateWindow();
  });
  lab->setObjectName(QStringLiteral("servingLabAction"));
  lab->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_L));
  lab->setToolTip(tr("Chat streams and a long prompt served under prefill-first, chunked and disaggregated "
                     "scheduling: the stall, TTFT, ITL and goodput"));
  file->addSeparator();
  QToolBar* mainBar = addToolBar(tr("Main"));
  mainBar->setObjectName(QStringLiteral("mainToolbar"));
  mainBar->setMovable(false);
  mainBar->addAction(newChat);
  mainBar->addAction(open);
  mainBar->addAction(models);
  mainBar->addAction(compare);
  mainBar->addAction(lab);
  QAction* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);
}

void MainWindow::createChatMenu() {
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
}

// The docks, the theme and the text size.
void MainWindow::createViewMenu() {
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
}

void MainWindow::createSettingsAndHelpMenus() {
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

void MainWindow::createChatToolbar(QVBoxLayout* column) {
  m_chatToolbar = new ChatToolbar;
  connect(m_chatToolbar, &ChatToolbar::modeChosen, this, &MainWindow::setConversationMode);
  connect(m_chatToolbar, &ChatToolbar::kvCacheToggled, this, [this](bool on) {
    GenerationSettings g = m_settings.generation;
    if (g.useKvCache == on) return;
    g.useKvCache = on;
    applyGenerationSettings(g);
  });
  connect(m_chatToolbar, &ChatToolbar::speculativeChosen, this, [this](const QString& mode) {
    GenerationSettings g = m_settings.generation;
    if (g.speculative == mode) return;
    g.speculative = mode;
    applyGenerationSettings(g);
  });
  connect(m_chatToolbar, &ChatToolbar::conversationSettingsRequested, this, &MainWindow::openConversationSettings);
  column->addWidget(m_chatToolbar);
  syncChatToolbar();
}

void MainWindow::syncChatToolbar() {
  if (!m_chatToolbar) return;
  // A remote server keeps its own KV cache and decides how it decodes.
  const bool remote = m_engine->hasModel() && m_engine->modelInfo().remote;
  m_chatToolbar->showGeneration(m_settings.generation, remote);
  // The metrics dock's speculative panel follows the same setting.
  if (m_metrics) m_metrics->setSpeculativeMode(m_settings.generation.speculative);
}

}  // namespace phaselab::ui
