// ChatView: the scrolling list of MessageWidgets of the open conversation.
//
// It follows the answer: while the view is at the bottom it stays there as
// messages arrive and the streaming answer grows (the scroll bar's range
// changes, the view moves with it). Scrolling up to read stops following and
// shows a "Jump to latest" button; scrolling back down, the button, or sending
// a message resumes it. Cards are as wide as the viewport, never wider.
// It takes the keyboard focus (the arrow and page keys scroll it) and then
// shows a frame in the palette's highlight colour, as a focused field does.
#pragma once

#include <QScrollArea>

#include "conversation_store.h"

class QToolButton;
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
  // A harmony model's reasoning for answer id, shown above its text.
  void appendReasoning(qint64 id, const QString& delta);
  void finishMessage(qint64 id, const MessageRecord& message);
  void editMessage(qint64 id, const QString& content);
  void setBusy(bool busy);
  // Labels of the two sides: "You" / "Assistant" in chat mode, "Text" /
  // "Continuation" in notebook mode. Applies to the cards shown next.
  void setRoleLabels(const QString& user, const QString& assistant);

  MessageWidget* messageWidget(qint64 id) const;
  QList<MessageWidget*> messageWidgets() const;
  bool isFollowing() const { return m_follow; }
  bool isJumpButtonShown() const;
  bool isFocusFrameShown() const;
  // Scrolls to the end and follows the answer again.
  void jumpToLatest();

 signals:
  void regenerateRequested(qint64 id);
  void editRequested(qint64 id);

 protected:
  void resizeEvent(QResizeEvent* e) override;
  void focusInEvent(QFocusEvent* e) override;
  void focusOutEvent(QFocusEvent* e) override;

 private:
  void onScrolled(int value);
  void onRangeChanged(int min, int max);
  void placeJumpButton();
  MessageWidget* makeCard(const MessageRecord& message);

  QWidget* m_content = nullptr;
  QVBoxLayout* m_layout = nullptr;
  QToolButton* m_jump = nullptr;
  QWidget* m_focusFrame = nullptr;
  QString m_userLabel, m_assistantLabel;
  bool m_busy = false;
  bool m_follow = true;  // keep the view at the bottom as content grows
};

}  // namespace phaselab::ui
