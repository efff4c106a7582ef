#include "chat_session.h"

#include "engine_controller.h"

namespace phaselab::ui {

ChatSession::ChatSession(ConversationStore* store, EngineController* engine, QObject* parent)
    : QObject(parent), m_store(store), m_engine(engine) {
  m_saveTimer.setSingleShot(true);
  m_saveTimer.setInterval(kSaveIntervalMs);
  connect(&m_saveTimer, &QTimer::timeout, this, &ChatSession::saveStreaming);
  connect(m_engine, &EngineController::tokensReady, this,
          [this](int requestId, const QString& delta, int) { onTokens(requestId, delta); });
  connect(m_engine, &EngineController::reasoningReady, this,
          [this](int requestId, const QString& delta) { onReasoning(requestId, delta); });
  connect(m_engine, &EngineController::generationFinished, this, &ChatSession::onFinished);
}

int ChatSession::indexOf(qint64 messageId) const {
  for (int i = 0; i < m_messages.size(); i++)
    if (m_messages[i].id == messageId) return i;
  return -1;
}

void ChatSession::openConversation(qint64 id) {
  if (isStreaming()) stop();
  m_conversationId = id;
  m_messages = id ? m_store->messages(id) : QList<MessageRecord>{};
  m_conversationSettings = id ? m_store->conversationSettings(id) : m_defaultSettings;
  emit conversationSettingsChanged(m_conversationSettings);
  emit conversationOpened(id, m_messages);
}

bool ChatSession::setConversationSettings(const ConversationSettings& settings) {
  if (const QString why = settings.validate(); !why.isEmpty()) {
    emit errorOccurred(why);
    return false;
  }
  if (m_conversationId != 0 && !m_store->setConversationSettings(m_conversationId, settings)) {
    emit errorOccurred(tr("Could not save the conversation's settings: %1").arg(m_store->lastError()));
    return false;
  }
  m_conversationSettings = settings;
  emit conversationSettingsChanged(settings);
  return true;
}

void ChatSession::newConversation() { openConversation(0); }

bool ChatSession::send(const QString& text) {
  // A chat message is trimmed; notebook text is kept as written (a trailing
  // newline starts a new paragraph) except for trailing spaces, which would
  // make the model's next word start with a space token of its own.
  const bool notebook = m_conversationSettings.mode == QLatin1String("notebook");
  QString t = text;
  if (notebook) {
    while (t.endsWith(QLatin1Char(' ')) || t.endsWith(QLatin1Char('\t'))) t.chop(1);
  } else {
    t = t.trimmed();
  }
  if (t.trimmed().isEmpty() || isStreaming()) return false;
  if (!m_engine->hasModel()) {
    emit errorOccurred(tr("No model is loaded: open one with File > Open Model (Ctrl+O)."));
    return false;
  }
  if (m_conversationId == 0) {
    QString title = t.simplified();
    if (title.size() > 48) title = title.left(47) + QChar(0x2026);
    m_conversationId = m_store->createConversation(title, m_conversationSettings);
    if (m_conversationId == 0) {
      emit errorOccurred(tr("Could not save the conversation: %1").arg(m_store->lastError()));
      return false;
    }
    emit conversationsChanged();
  }
  MessageRecord user;
  user.conversationId = m_conversationId;
  user.role = QStringLiteral("user");
  user.content = t;
  user.state = QStringLiteral("done");
  user.id = m_store->addMessage(m_conversationId, user.role, user.content, user.state);
  m_messages.push_back(user);
  emit messageAdded(user);
  return startAnswer();
}

bool ChatSession::continueText() {
  if (m_conversationSettings.mode != QLatin1String("notebook") || m_messages.isEmpty() || isStreaming()) return false;
  if (!m_engine->hasModel()) {
    emit errorOccurred(tr("No model is loaded: open one with File > Open Model (Ctrl+O)."));
    return false;
  }
  return startAnswer();
}

bool ChatSession::startAnswer() {
  QList<ChatTurn> turns;
  for (const MessageRecord& m : m_messages) {
    // Failed answers are not part of the conversation the model sees.
    if (m.role == QLatin1String("assistant") && m.state == QLatin1String("error")) continue;
    turns.push_back({m.role, m.content});
  }
  MessageRecord answer;
  answer.conversationId = m_conversationId;
  answer.role = QStringLiteral("assistant");
  answer.state = QStringLiteral("streaming");
  answer.id = m_store->addMessage(m_conversationId, answer.role, QString(), answer.state);
  if (answer.id == 0) {
    emit errorOccurred(tr("Could not save the answer: %1").arg(m_store->lastError()));
    return false;
  }
  GenerationSettings g = m_settings;
  g.mode = m_conversationSettings.mode;
  g.chatTemplate = m_conversationSettings.chatTemplate;
  if (m_conversationSettings.hasSystemPrompt) g.systemPrompt = m_conversationSettings.systemPrompt;
  const int request = m_engine->send(turns, g);
  if (request == 0) {
    m_store->deleteMessage(answer.id);
    emit errorOccurred(tr("The engine is busy or has no model."));
    return false;
  }
  m_requestId = request;
  m_streamingId = answer.id;
  m_streamingText.clear();
  m_streamingReasoning.clear();
  m_messages.push_back(answer);
  emit messageAdded(answer);
  emit conversationsChanged();
  return true;
}

bool ChatSession::regenerate() {
  if (isStreaming() || m_messages.isEmpty()) return false;
  // Drop the last answer (and anything after the last user message).
  while (!m_messages.isEmpty() && m_messages.back().role != QLatin1String("user")) {
    const qint64 id = m_messages.back().id;
    m_store->deleteMessage(id);
    m_messages.pop_back();
    emit messageRemoved(id);
  }
  if (m_messages.isEmpty()) return false;
  return startAnswer();
}

bool ChatSession::editAndResend(qint64 messageId, const QString& text) {
  const int i = indexOf(messageId);
  if (isStreaming() || i < 0 || m_messages[i].role != QLatin1String("user") || text.trimmed().isEmpty()) return false;
  m_store->updateMessage(messageId, text.trimmed(), QStringLiteral("done"));
  m_store->deleteMessagesAfter(m_conversationId, messageId);
  while (m_messages.size() > i + 1) {
    emit messageRemoved(m_messages.back().id);
    m_messages.pop_back();
  }
  m_messages[i].content = text.trimmed();
  emit messageEdited(messageId, m_messages[i].content);
  return startAnswer();
}

void ChatSession::stop() {
  if (isStreaming()) m_engine->stop();
}

// The text's leading whitespace removed; whether anything is left.
static bool dropLeadingSpace(QString& d) {
  qsizetype i = 0;
  while (i < d.size() && d[i].isSpace()) i++;
  d.remove(0, i);
  return !d.isEmpty();
}

void ChatSession::onTokens(int requestId, const QString& delta) {
  if (requestId != m_requestId || m_streamingId == 0) return;
  QString d = delta;
  // A chat answer starts at its first visible character: SentencePiece
  // models begin it with a word-start space (" Hello"). A notebook's
  // continuation keeps it: it joins the text before it.
  if (m_streamingText.isEmpty() && m_conversationSettings.mode != QLatin1String("notebook") && !dropLeadingSpace(d))
    return;
  m_streamingText += d;
  emit answerDelta(m_streamingId, d);
  if (!m_saveTimer.isActive()) m_saveTimer.start();
}

void ChatSession::onReasoning(int requestId, const QString& delta) {
  if (requestId != m_requestId || m_streamingId == 0) return;
  QString d = delta;
  // Like the answer, the reasoning starts at its first visible character.
  if (m_streamingReasoning.isEmpty() && !dropLeadingSpace(d)) return;
  m_streamingReasoning += d;
  emit reasoningDelta(m_streamingId, d);
  if (!m_saveTimer.isActive()) m_saveTimer.start();
}

void ChatSession::saveStreaming() {
  if (m_streamingId == 0) return;
  m_store->updateAnswer(m_streamingId, m_streamingText, m_streamingReasoning, QStringLiteral("streaming"));
}

void ChatSession::onFinished(int requestId, const RequestStats& stats) {
  if (requestId != m_requestId || m_streamingId == 0) return;
  m_saveTimer.stop();
  const QString state = !stats.error.isEmpty()                           ? QStringLiteral("error")
                        : stats.stopReason == QLatin1String("cancelled") ? QStringLiteral("stopped")
                                                                         : QStringLiteral("done");
  m_store->finishMessage(m_streamingId, m_streamingText, state, stats, m_streamingReasoning);
  const int i = indexOf(m_streamingId);
  MessageRecord rec;
  if (i >= 0) {
    m_messages[i].content = m_streamingText;
    m_messages[i].reasoning = m_streamingReasoning;
    m_messages[i].state = state;
    m_messages[i].stats = stats;
    m_messages[i].hasStats = true;
    rec = m_messages[i];
  }
  const qint64 id = m_streamingId;
  m_streamingId = 0;
  m_requestId = 0;
  emit answerFinished(id, rec);
}

}  // namespace phaselab::ui
