// ConversationStore: conversations and messages in SQLite through Qt SQL.
// WAL journal (readers never block the writer, a killed process loses only
// what was not yet written), a schema_version table with ordered migrations,
// and reads that skip a malformed row (with a log line) instead of failing.
#pragma once

#include <QDateTime>
#include <QList>
#include <QObject>
#include <QString>
#include <QStringList>

#include "engine_types.h"

class QSqlQuery;

namespace phaselab::ui {

struct ConversationRecord {
  qint64 id = 0;
  QString title;
  QDateTime createdAt;
  QDateTime updatedAt;
};

// How a conversation talks to the model, kept per conversation.
struct ConversationSettings {
  // chat: turns through a chat template. notebook: the model continues the
  // person's text as written, the sensible way to use a base model.
  QString mode = QStringLiteral("chat");
  QString systemPrompt;
  bool hasSystemPrompt = false;  // false: the application's default system prompt
  QString chatTemplate;          // empty: the model's own template; else one of templateNames()

  static QStringList modeNames();      // chat, notebook
  static QStringList templateNames();  // gemma, chatml, llama3, llama2, plain, plain-fewshot
  // Empty when valid, else what is wrong (naming the field).
  QString validate() const;
  bool operator==(const ConversationSettings&) const = default;
};

// A saved run of the Compare window: its options and result rows as JSON.
struct CompareRunRecord {
  qint64 id = 0;
  QDateTime createdAt;
  QString title;
  QByteArray options;  // the window's settings (variants, text, chunks)
  QByteArray rows;     // phaselab::compare_rows_json()
};

// A saved run of the Serving lab: its inputs (options) and the result of
// phaselab-cli bench --serving --json (rows).
using ServingRunRecord = CompareRunRecord;

struct MessageRecord {
  qint64 id = 0;
  qint64 conversationId = 0;
  QString role;     // user | assistant | system
  QString content;
  QString state;    // done | streaming | stopped | interrupted | error
  QString reasoning;  // a reasoning model's reasoning (not part of content); empty: none
  bool hasStats = false;
  RequestStats stats;
};

class ConversationStore : public QObject {
  Q_OBJECT
 public:
  static constexpr int kSchemaVersion = 6;

  explicit ConversationStore(QObject* parent = nullptr);
  ~ConversationStore() override;

  // Opens (creating if needed) and migrates. False with lastError() on
  // failure, in which case the file was not written to: a damaged file (fails
  // SQLite's integrity check, misses a table, has a negative or newer schema
  // version), a folder in its place, or a file or folder that cannot be
  // written.
  bool open(const QString& path);
  // A database in memory with the same schema, so that chatting goes on when
  // the file cannot be used: isPersistent() is false, nothing is saved.
  bool openInMemory();
  void close();
  bool isOpen() const { return !m_connection.isEmpty(); }
  bool isPersistent() const { return m_persistent; }
  // Renames a database that cannot be used (and its -wal/-shm files) to
  // PATH.damaged-<time>, keeping it as it is. Returns the new name, or empty
  // with *error.
  static QString moveAside(const QString& path, QString* error);
  QString lastError() const { return m_lastError; }
  int schemaVersion() const;
  // The default location: $PHASELAB_DB, else <user_data_dir>/phaselab.sqlite.
  static QString defaultPath();

  QList<ConversationRecord> conversations(const QString& filter = {}) const;
  // The conversation with this id; id 0 when there is none.
  ConversationRecord conversation(qint64 id) const;
  // 0 with lastError() when the settings are invalid or the insert fails.
  qint64 createConversation(const QString& title, const ConversationSettings& settings = {});
  // Defaults for an unknown id; an unknown mode or template read from the
  // file falls back to the default with a log line, like other bad rows.
  ConversationSettings conversationSettings(qint64 id) const;
  bool setConversationSettings(qint64 id, const ConversationSettings& settings);
  bool renameConversation(qint64 id, const QString& title);
  bool deleteConversation(qint64 id);

  QList<MessageRecord> messages(qint64 conversationId) const;
  qint64 addMessage(qint64 conversationId, const QString& role, const QString& content,
                    const QString& state = QStringLiteral("done"));
  // A user message's new text (its reasoning stays none).
  bool updateMessage(qint64 id, const QString& content, const QString& state);
  // A streaming answer's text and reasoning so far (empty reasoning: none).
  bool updateAnswer(qint64 id, const QString& content, const QString& reasoning, const QString& state);
  bool finishMessage(qint64 id, const QString& content, const QString& state, const RequestStats& stats,
                     const QString& reasoning = {});
  bool deleteMessage(qint64 id);
  // Deletes the messages of a conversation that come after message id.
  bool deleteMessagesAfter(qint64 conversationId, qint64 id);

  // Compare window runs, newest first.
  qint64 saveCompareRun(const QString& title, const QByteArray& options, const QByteArray& rows);
  QList<CompareRunRecord> compareRuns() const;
  bool deleteCompareRun(qint64 id);
  // Serving lab runs, newest first.
  qint64 saveServingRun(const QString& title, const QByteArray& options, const QByteArray& result);
  QList<ServingRunRecord> servingRuns() const;
  bool deleteServingRun(qint64 id);

  // Whole conversations written at once (import): all of them or, on any
  // failure, none (one transaction). record.createdAt is kept when valid;
  // updatedAt is now, so they come first in the list. Messages keep their
  // role, content, reasoning, state and stats. ids gets the new conversations' ids.
  struct ConversationData {
    ConversationRecord record;
    ConversationSettings settings;
    QList<MessageRecord> messages;
  };
  bool insertConversations(const QList<ConversationData>& items, QList<qint64>* ids = nullptr);

 private:
  bool openConnection(const QString& path);
  bool checkBeforeWriting(bool existing);
  bool exec(const QString& sql);
  bool run(QSqlQuery& q);
  // table: compare_runs or serving_runs.
  qint64 saveRun(const char* table, const QString& title, const QByteArray& options, const QByteArray& rows);
  QList<CompareRunRecord> runs(const char* table) const;
  bool deleteRun(const char* table, qint64 id);
  bool migrate();
  void touchConversation(qint64 id);

  QString m_connection;
  QString m_lastError;
  bool m_persistent = false;
};

}  // namespace phaselab::ui
