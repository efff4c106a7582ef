// ChatSession: one open conversation between the store, the engine and the
// view. It owns no widgets: it turns "send", "regenerate", "edit" into store
// rows and engine requests, and saves the streaming answer as it grows.
#pragma once

#include <QElapsedTimer>
#include <QObject>
#include <QTimer>

#include "conversation_store.h"
#include "engine_types.h"

namespace phaselab::ui {

class EngineController;

class ChatSession : public QObject {
  Q_OBJECT
 public:
  // A streaming answer reaches the database at most this often (and at finish),
  // so a crash loses at most this much text.
  static constexpr int kSaveIntervalMs = 250;

  ChatSession(ConversationStore* store, EngineController* engine, QObject* parent = nullptr);

  void setGenerationSettings(const GenerationSettings& s) { m_settings = s; }
  const GenerationSettings& generationSettings() const { return m_settings; }

  // The open conversation's mode, system prompt and template (saved with it;
  // for a new conversation, used when its first message creates it).
  const ConversationSettings& conversationSettings() const { return m_conversationSettings; }
  bool setConversationSettings(const ConversationSettings& settings);
  // What a new conversation starts with (notebook for a base model, if the
  // person chose so); does not change the open one.
  void setDefaultConversationSettings(const ConversationSettings& s) { m_defaultSettings = s; }

  qint64 conversationId() const { return m_conversationId; }
  const QList<MessageRecord>& messages() const { return m_messages; }
  bool isStreaming() const { return m_streamingId != 0; }

  void openConversation(qint64 id);
  void newConversation();  // the row is created with the first message
  bool send(const QString& text);
  // Notebook mode: the model continues the text so far with nothing added
  // (Continue with an empty box). False when there is no text yet.
  bool continueText();
  bool regenerate();
  bool editAndResend(qint64 messageId, const QString& text);
  void stop();
  // Writes the streaming answer now (window closing); it stays marked
  // streaming, which the next start shows as interrupted.
  void flush() { saveStreaming(); }

 signals:
  void conversationOpened(qint64 id, const QList<phaselab::ui::MessageRecord>& messages);
  void conversationSettingsChanged(const phaselab::ui::ConversationSettings& settings);
  void conversationsChanged();
  void messageAdded(const phaselab::ui::MessageRecord& message);
  void messageRemoved(qint64 id);
  void messageEdited(qint64 id, const QString& content);
  void answerDelta(qint64 messageId, const QString& delta);
  // A reasoning model's reasoning (gpt-oss's analysis channel, a Qwen3's
  // or DeepSeek-R1's <think> block, a remote server's reasoning_content):
  // shown above the answer, saved beside it
  // (MessageRecord::reasoning), never part of its text.
  void reasoningDelta(qint64 messageId, const QString& delta);
  void answerFinished(qint64 messageId, const phaselab::ui::MessageRecord& message);
  void errorOccurred(const QString& message);

 private:
  bool startAnswer();
  void onTokens(int requestId, const QString& delta);
  void onReasoning(int requestId, const QString& delta);
  void onFinished(int requestId, const RequestStats& stats);
  void saveStreaming();
  int indexOf(qint64 messageId) const;

  ConversationStore* m_store;
  EngineController* m_engine;
  GenerationSettings m_settings;
  ConversationSettings m_conversationSettings, m_defaultSettings;
  qint64 m_conversationId = 0;
  QList<MessageRecord> m_messages;
  qint64 m_streamingId = 0;  // the assistant message being written
  int m_requestId = 0;
  QString m_streamingText;
  QString m_streamingReasoning;
  QTimer m_saveTimer;
};

}  // namespace phaselab::ui
