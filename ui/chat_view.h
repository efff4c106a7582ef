// ChatView: the scrolling list of MessageWidgets of the open conversation.
#pragma once

#include <QScrollArea>

#include "conversation_store.h"

class QVBoxLayout;

namespace phaselab::ui {

class MessageWidget;

class ChatView : public QScrollArea {
  Q_OBJECT
 public:
  explicit ChatView(QWidget* parent = nullptr);

  void setMessages(const QList<MessageRecord>& messages);
  void addMessage(const MessageRecord& message);
  void removeMessage(qint64 id);
  void appendToMessage(qint64 id, const QString& delta);
  void finishMessage(qint64 id, const MessageRecord& message);
  void editMessage(qint64 id, const QString& content);
  void setBusy(bool busy);

  MessageWidget* messageWidget(qint64 id) const;
  QList<MessageWidget*> messageWidgets() const;

 signals:
  void regenerateRequested(qint64 id);
  void editRequested(qint64 id);

 private:
  void scrollToEndIfFollowing(bool wasAtEnd);
  bool atEnd() const;

  QWidget* m_content = nullptr;
  QVBoxLayout* m_layout = nullptr;
  bool m_busy = false;
};

}  // namespace phaselab::ui
