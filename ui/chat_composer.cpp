#include "chat_composer.h"

#include <QHBoxLayout>
#include <QKeyEvent>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QVBoxLayout>

namespace phaselab::ui {

ChatComposer::ChatComposer(QWidget* parent) : QWidget(parent) {
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  m_editor = new QPlainTextEdit;
  m_editor->setObjectName(QStringLiteral("composerEditor"));
  m_editor->setPlaceholderText(tr("Type a message; Ctrl+Enter sends, Esc stops the answer"));
  m_editor->setAccessibleName(tr("Message"));
  m_editor->setMaximumHeight(110);
  m_editor->setTabChangesFocus(true);
  m_editor->installEventFilter(this);
  layout->addWidget(m_editor, 1);
  auto* buttons = new QVBoxLayout;
  m_send = new QPushButton(tr("Send"));
  m_send->setObjectName(QStringLiteral("sendButton"));
  m_send->setToolTip(tr("Send (Ctrl+Enter)"));
  m_stop = new QPushButton(tr("Stop"));
  m_stop->setObjectName(QStringLiteral("stopButton"));
  m_stop->setToolTip(tr("Stop the answer (Esc)"));
  m_stop->setEnabled(false);
  m_send->setAccessibleName(tr("Send"));
  m_stop->setAccessibleName(tr("Stop the answer"));
  buttons->addWidget(m_send);
  buttons->addWidget(m_stop);
  buttons->addStretch(1);
  layout->addLayout(buttons);
  connect(m_send, &QPushButton::clicked, this, [this] { emit sendRequested(text()); });
  connect(m_stop, &QPushButton::clicked, this, &ChatComposer::stopRequested);
}

QString ChatComposer::text() const { return m_editor->toPlainText(); }
void ChatComposer::setNotebookMode(bool notebook) {
  m_editor->setPlaceholderText(notebook ? tr("Write the start of a text; the model continues it (Ctrl+Enter)")
                                        : tr("Type a message; Ctrl+Enter sends, Esc stops the answer"));
  m_send->setText(notebook ? tr("Continue") : tr("Send"));
  m_send->setToolTip(notebook ? tr("Let the model continue the text (Ctrl+Enter)") : tr("Send (Ctrl+Enter)"));
}

void ChatComposer::setText(const QString& text) { m_editor->setPlainText(text); }
void ChatComposer::clear() { m_editor->clear(); }
void ChatComposer::focusEditor() { m_editor->setFocus(); }

void ChatComposer::setBusy(bool busy) {
  m_send->setEnabled(!busy);
  m_stop->setEnabled(busy);
}

bool ChatComposer::eventFilter(QObject* watched, QEvent* event) {
  // The editor would take Ctrl+Enter as a newline before the window's
  // shortcut sees it.
  if (watched == m_editor && event->type() == QEvent::KeyPress) {
    auto* k = static_cast<QKeyEvent*>(event);
    if ((k->key() == Qt::Key_Return || k->key() == Qt::Key_Enter) && (k->modifiers() & Qt::ControlModifier)) {
      if (m_send->isEnabled()) emit sendRequested(text());
      return true;
    }
  }
  return QWidget::eventFilter(watched, event);
}

}  // namespace phaselab::ui
