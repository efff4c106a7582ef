// MainWindow's banners above the chat: an error (shown, never fatal), a
// conversation database that cannot be used, and the note that a model is a
// base model.
#include <QPushButton>
#include <QStatusBar>
#include <QToolButton>
#include <QVBoxLayout>

#include "banner.h"
#include "chat_session.h"
#include "conversation_list.h"
#include "engine_controller.h"
#include "main_window.h"
#include "phaselab/log.h"
#include "status_bar_labels.h"

namespace phaselab::ui {

// The error banner, and the base model note below it.
void MainWindow::createBanners(QVBoxLayout* column) {
  // Tints: the banners' colours are the window's, tinted (Banner::background).
  m_errorBanner = new Banner(QColor(230, 40, 40));
  m_errorBanner->setObjectName(QStringLiteral("errorBanner"));
  connect(m_errorBanner->addDismissButton(), &QToolButton::clicked, this, &MainWindow::clearError);
  column->addWidget(m_errorBanner);
  // A base model (no chat template) is said to be one, with the way to use
  // it well one click away.
  m_baseModelNote = new Banner(QColor(40, 120, 240));
  m_baseModelNote->setObjectName(QStringLiteral("baseModelNote"));
  auto* notebook = new QPushButton(tr("Use Notebook Mode"));
  notebook->setObjectName(QStringLiteral("useNotebookMode"));
  m_baseModelNote->addButton(notebook);
  connect(notebook, &QPushButton::clicked, this, [this] { setConversationMode(QStringLiteral("notebook")); });
  QToolButton* dismissNote = m_baseModelNote->addDismissButton(tr("Dismiss the base model note"));
  connect(dismissNote, &QToolButton::clicked, this, [this] {
    m_baseModelNoteDismissed = true;
    updateBaseModelNote();
  });
  column->addWidget(m_baseModelNote);
}

// A database that cannot be used never stops chatting: the conversations
// live in memory, the file is left as it was, and the window says so until
// it is fixed.
void MainWindow::openStore(const QString& dbPath, QVBoxLayout* column) {
  m_storeWarning = new Banner(QColor(240, 160, 20));
  m_storeWarning->setObjectName(QStringLiteral("storeWarning"));
  auto* moveAside = new QPushButton(tr("Move It Aside and Start Fresh"));
  moveAside->setObjectName(QStringLiteral("moveDatabaseAside"));
  m_storeWarning->addButton(moveAside);
  connect(moveAside, &QPushButton::clicked, this, &MainWindow::moveDatabaseAside);
  column->insertWidget(1, m_storeWarning);  // below the error banner
  m_dbPath = dbPath;
  if (!m_store.open(dbPath)) {
    const QString why = m_store.lastError();
    spdlog::warn("gui: conversations are not saved: {}", why.toStdString());
    m_storeWarning->setText(
        tr("<b>Conversations are not being saved.</b> %1. The file %2 was left as it is; chats stay in memory "
           "until you quit. Moving it aside keeps it under a new name.")
            .arg(why.toHtmlEscaped(), dbPath.toHtmlEscaped()));
    m_storeWarning->show();
    m_store.openInMemory();
  }
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
  m_statusLabels->setNotSaved(!m_store.isPersistent());
  m_chat->newConversation();
  m_conversations->refresh();
}

bool MainWindow::isStoreWarningShown() const { return m_storeWarning->isVisibleTo(this); }

bool MainWindow::isNotSavedShown() const { return m_statusLabels->isNotSavedShown(); }

bool MainWindow::isErrorShown() const { return m_errorBanner->isVisibleTo(this); }

void MainWindow::showError(const QString& message) {
  // Errors are shown, never fatal: the window stays usable.
  m_lastError = message;
  m_errorBanner->setText(message);
  m_errorBanner->show();
  statusBar()->showMessage(message, 8000);
  spdlog::warn("gui: {}", message.toStdString());
}

void MainWindow::clearError() { m_errorBanner->hide(); }

void MainWindow::updateBaseModelNote() {
  const bool base = m_engine->hasModel() && !m_engine->modelInfo().hasChatTemplate;
  const bool notebook = m_chat->conversationSettings().mode == QLatin1String("notebook");
  if (base)
    m_baseModelNote->setText(
        tr("<b>%1 is a base model</b>: it has no chat template and was not trained to answer. Chat gives it "
           "three example exchanges first; Notebook mode, where it continues your text, suits it best.")
            .arg(m_engine->modelInfo().name.toHtmlEscaped()));
  m_baseModelNote->setVisible(base && !notebook && !m_baseModelNoteDismissed);
}

bool MainWindow::isBaseModelNoteShown() const { return m_baseModelNote->isVisibleTo(this); }

}  // namespace phaselab::ui
