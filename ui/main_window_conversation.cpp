// MainWindow and the open conversation: sending, its mode and settings,
// regenerating and editing a message, export and import.
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QInputDialog>
#include <QRegularExpression>
#include <QSaveFile>
#include <QStatusBar>

#include "chat_composer.h"
#include "chat_session.h"
#include "chat_toolbar.h"
#include "chat_view.h"
#include "conversation_export.h"
#include "conversation_list.h"
#include "conversation_settings_dialog.h"
#include "engine_controller.h"
#include "main_window.h"
#include "message_widget.h"

namespace phaselab::ui {

bool MainWindow::sendMessage(const QString& text) {
  if (text.trimmed().isEmpty()) {
    // An empty box: a notebook continues its text; otherwise say what to do.
    const bool notebook = m_chat->conversationSettings().mode == QLatin1String("notebook");
    if (notebook && m_chat->continueText()) {
      clearError();
      return true;
    }
    if (!m_chat->isStreaming())
      statusBar()->showMessage(notebook && !m_chat->messages().isEmpty()
                                   ? tr("The model cannot continue now.")
                                   : notebook ? tr("Write the start of a text in the box, then press Continue.")
                                              : tr("Type a message in the box, then press Send."),
                               6000);
    return false;
  }
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

void MainWindow::applyConversationSettings(const ConversationSettings& s) {
  const bool notebook = s.mode == QLatin1String("notebook");
  m_chatToolbar->showMode(s.mode);
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

}  // namespace phaselab::ui
