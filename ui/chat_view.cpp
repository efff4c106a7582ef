#include "chat_view.h"

#include <QScrollBar>
#include <QTimer>
#include <QVBoxLayout>

#include "message_widget.h"

namespace phaselab::ui {

ChatView::ChatView(QWidget* parent) : QScrollArea(parent) {
  setObjectName(QStringLiteral("chatView"));
  setWidgetResizable(true);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  m_content = new QWidget;
  m_layout = new QVBoxLayout(m_content);
  m_layout->setContentsMargins(8, 8, 8, 8);
  m_layout->setSpacing(8);
  m_layout->addStretch(1);
  setWidget(m_content);
}

QList<MessageWidget*> ChatView::messageWidgets() const { return m_content->findChildren<MessageWidget*>(); }

MessageWidget* ChatView::messageWidget(qint64 id) const {
  for (MessageWidget* w : messageWidgets())
    if (w->messageId() == id) return w;
  return nullptr;
}

void ChatView::setMessages(const QList<MessageRecord>& messages) {
  for (MessageWidget* w : messageWidgets()) {
    m_layout->removeWidget(w);
    delete w;
  }
  for (const MessageRecord& m : messages) addMessage(m);
  QTimer::singleShot(0, this, [this] { scrollToEndIfFollowing(true); });
}

void ChatView::addMessage(const MessageRecord& message) {
  const bool follow = atEnd();
  auto* w = new MessageWidget(message, m_content);
  w->setRegenerateEnabled(!m_busy);
  connect(w, &MessageWidget::regenerateRequested, this, &ChatView::regenerateRequested);
  connect(w, &MessageWidget::editRequested, this, &ChatView::editRequested);
  m_layout->insertWidget(m_layout->count() - 1, w);  // before the stretch
  QTimer::singleShot(0, this, [this, follow] { scrollToEndIfFollowing(follow); });
}

void ChatView::removeMessage(qint64 id) {
  if (MessageWidget* w = messageWidget(id)) {
    m_layout->removeWidget(w);
    delete w;
  }
}

void ChatView::appendToMessage(qint64 id, const QString& delta) {
  if (MessageWidget* w = messageWidget(id)) {
    const bool follow = atEnd();
    w->appendText(delta);
    if (follow) QTimer::singleShot(MessageWidget::kRenderIntervalMs + 5, this, [this] { scrollToEndIfFollowing(true); });
  }
}

void ChatView::finishMessage(qint64 id, const MessageRecord& message) {
  if (MessageWidget* w = messageWidget(id)) {
    const bool follow = atEnd();
    w->finish(message);
    QTimer::singleShot(0, this, [this, follow] { scrollToEndIfFollowing(follow); });
  }
}

void ChatView::editMessage(qint64 id, const QString& content) {
  if (MessageWidget* w = messageWidget(id)) w->setText(content);
}

void ChatView::setBusy(bool busy) {
  m_busy = busy;
  for (MessageWidget* w : messageWidgets()) w->setRegenerateEnabled(!busy);
}

bool ChatView::atEnd() const {
  const QScrollBar* sb = verticalScrollBar();
  return sb->value() >= sb->maximum() - 40;
}

void ChatView::scrollToEndIfFollowing(bool wasAtEnd) {
  // Only follow the answer when the user has not scrolled up to read.
  if (wasAtEnd) verticalScrollBar()->setValue(verticalScrollBar()->maximum());
}

}  // namespace phaselab::ui
