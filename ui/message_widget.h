// MessageWidget: one chat message, rendered as Markdown, with its stats line
// and actions (Copy, Regenerate for answers, Edit for questions).
#pragma once

#include <QFrame>
#include <QTimer>

#include "conversation_store.h"

class QLabel;
class QTextBrowser;
class QToolButton;

namespace phaselab::ui {

class MessageWidget : public QFrame {
  Q_OBJECT
 public:
  // Streaming text is re-rendered at most this often: Markdown layout of a
  // long answer costs a few ms, and 30 Hz is as fast as anyone reads.
  static constexpr int kRenderIntervalMs = 33;

  explicit MessageWidget(const MessageRecord& message, QWidget* parent = nullptr);

  qint64 messageId() const { return m_message.id; }
  const MessageRecord& message() const { return m_message; }
  QString text() const { return m_message.content; }
  QString statsText() const;

  void appendText(const QString& delta);
  // A reasoning model's reasoning, shown dimmed above the answer as it
  // streams and when a saved answer has some (MessageRecord::reasoning);
  // never part of the message's text.
  void appendReasoning(const QString& delta);
  QString reasoning() const { return m_message.reasoning; }
  // Whether the reasoning's text is shown (its toggle is): open while the
  // answer streams, closed when it is done and on a saved answer.
  bool isReasoningOpen() const;
  void setReasoningOpen(bool open);
  void setText(const QString& text);
  void finish(const MessageRecord& message);
  void setRegenerateEnabled(bool enabled);
  void setRoleLabel(const QString& label);

 signals:
  void regenerateRequested(qint64 id);
  void editRequested(qint64 id);

 protected:
  void resizeEvent(QResizeEvent* e) override;

 private:
  void render();
  void applyAppearance();
  void fitHeight();
  void updateFooter();
  void showReasoning();

  MessageRecord m_message;
  QLabel* m_role = nullptr;
  QToolButton* m_reasoningToggle = nullptr;  // hidden while the message has no reasoning
  QLabel* m_reasoning = nullptr;             // shown while the toggle is open
  bool m_reasoningOpen = false;
  bool m_reasoningChosen = false;  // the person used the toggle: finish() leaves it as it is
  QTextBrowser* m_body = nullptr;
  QLabel* m_stats = nullptr;
  QToolButton* m_copy = nullptr;
  QToolButton* m_regenerate = nullptr;
  QToolButton* m_edit = nullptr;
  QTimer m_renderTimer;
};

}  // namespace phaselab::ui
