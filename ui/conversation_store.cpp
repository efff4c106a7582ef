#include "conversation_store.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonDocument>
#include <QSqlDatabase>
#include <QSqlError>
#include <QSqlQuery>
#include <QVariant>
#include <atomic>
#include <tuple>

#include "phaselab/log.h"

namespace phaselab::ui {

namespace {

std::atomic<int> g_connectionCounter{0};

// Migration i takes the schema from version i to i + 1. Append only: a
// shipped migration is never edited, so every old database follows the same path.
const char* const kMigrations[] = {
    // 0 -> 1: the first schema.
    "CREATE TABLE conversations ("
    "  id INTEGER PRIMARY KEY,"
    "  title TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL);"
    "CREATE TABLE messages ("
    "  id INTEGER PRIMARY KEY,"
    "  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
    "  role TEXT NOT NULL,"
    "  content TEXT NOT NULL,"
    "  state TEXT NOT NULL DEFAULT 'done',"
    "  stats TEXT,"
    "  created_at INTEGER NOT NULL);"
    "CREATE INDEX messages_by_conversation ON messages(conversation_id, id);",
    // 1 -> 2: updated_at index for the conversation list's order.
    "CREATE INDEX conversations_by_update ON conversations(updated_at DESC);",
    // 2 -> 3: per-conversation settings (ConversationSettings). NULL
    // system_prompt: the application's default; NULL or '' template: the
    // model's own.
    "ALTER TABLE conversations ADD COLUMN mode TEXT NOT NULL DEFAULT 'chat';"
    "ALTER TABLE conversations ADD COLUMN system_prompt TEXT;"
    "ALTER TABLE conversations ADD COLUMN template TEXT;",
    // 3 -> 4: saved runs of the Compare window (rows as phaselab::compare_rows_json).
    "CREATE TABLE compare_runs ("
    "  id INTEGER PRIMARY KEY,"
    "  created_at INTEGER NOT NULL,"
    "  title TEXT NOT NULL,"
    "  options TEXT NOT NULL,"
    "  rows TEXT NOT NULL);",
    // 4 -> 5: saved runs of the Serving lab (rows: the result of
    // phaselab-cli bench --serving --json, serving_result.h).
    "CREATE TABLE serving_runs ("
    "  id INTEGER PRIMARY KEY,"
    "  created_at INTEGER NOT NULL,"
    "  title TEXT NOT NULL,"
    "  options TEXT NOT NULL,"
    "  rows TEXT NOT NULL);",
    // 5 -> 6: a reasoning model's reasoning beside its answer (gpt-oss's
    // analysis channel, a <think> block, a remote server's
    // reasoning_content); NULL: none.
    "ALTER TABLE messages ADD COLUMN reasoning TEXT;",
};
static_assert(std::size(kMigrations) == ConversationStore::kSchemaVersion);

qint64 nowMs() { return QDateTime::currentMSecsSinceEpoch(); }

// NULL when unset. A null QString binds as NULL too, so a set but empty
// value is bound as '' explicitly.
QVariant textOrNull(bool set, const QString& s) {
  if (!set) return QVariant(QString());
  return s.isNull() ? QStringLiteral("") : s;
}

}  // namespace

QStringList ConversationSettings::modeNames() { return {QStringLiteral("chat"), QStringLiteral("notebook")}; }

QStringList ConversationSettings::templateNames() {
  return {QStringLiteral("gemma"),  QStringLiteral("chatml"), QStringLiteral("llama3"),       QStringLiteral("llama2"),
          QStringLiteral("phi3"),   QStringLiteral("plain"),  QStringLiteral("plain-fewshot")};
}

QString ConversationSettings::validate() const {
  if (!modeNames().contains(mode))
    return QStringLiteral("mode: '%1' is not one of %2").arg(mode, modeNames().join(QStringLiteral(", ")));
  if (!chatTemplate.isEmpty() && !templateNames().contains(chatTemplate))
    return QStringLiteral("template: '%1' is not one of %2 (or empty for the model's own)")
        .arg(chatTemplate, templateNames().join(QStringLiteral(", ")));
  return {};
}

ConversationStore::ConversationStore(QObject* parent) : QObject(parent) {}

ConversationStore::~ConversationStore() { close(); }

QString ConversationStore::defaultPath() {
  const QByteArray env = qgetenv("PHASELAB_DB");
  if (!env.isEmpty()) return QString::fromLocal8Bit(env);
  return QDir(QString::fromStdString(user_data_dir())).filePath(QStringLiteral("phaselab.sqlite"));
}

bool ConversationStore::open(const QString& path) {
  close();
  m_persistent = false;
  const QFileInfo info(path);
  if (info.exists() && !info.isFile()) {
    m_lastError = QStringLiteral("%1 is not a file (a folder or a device is in its place)").arg(path);
    return false;
  }
  if (!info.exists() && !QDir().mkpath(info.absolutePath())) {
    m_lastError = QStringLiteral("cannot create the folder %1").arg(info.absolutePath());
    return false;
  }
  if (!openConnection(path)) return false;
  // Everything is read and checked before the first write: a file that fails
  // a check is left exactly as it was.
  if (!checkBeforeWriting(info.exists() && info.size() > 0)) {
    const QString err = m_lastError;
    close();
    m_lastError = err;
    return false;
  }
  // WAL + synchronous=NORMAL: a commit survives a killed process (the OS has
  // the WAL pages); only a power loss can drop the last commits.
  if (!exec(QStringLiteral("PRAGMA journal_mode=WAL")) || !exec(QStringLiteral("PRAGMA synchronous=NORMAL")) ||
      !exec(QStringLiteral("PRAGMA foreign_keys=ON")) || !exec(QStringLiteral("PRAGMA busy_timeout=2000")) ||
      !migrate()) {
    const QString err = m_lastError;
    close();
    m_lastError = QStringLiteral("%1 cannot be written (%2)").arg(path, err);
    return false;
  }
  // An answer still marked streaming was cut off by a crash or a kill: keep
  // the text, say so.
  exec(QStringLiteral("UPDATE messages SET state='interrupted' WHERE state='streaming'"));
  m_persistent = true;
  return true;
}

bool ConversationStore::openInMemory() {
  close();
  m_persistent = false;
  if (!openConnection(QStringLiteral(":memory:"))) return false;
  return exec(QStringLiteral("PRAGMA foreign_keys=ON")) && migrate();
}

bool ConversationStore::openConnection(const QString& path) {
  const QString name = QStringLiteral("phaselab-store-%1").arg(g_connectionCounter.fetch_add(1));
  {
    QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), name);
    if (!db.isValid()) {
      m_lastError = QStringLiteral("Qt's SQLite driver is missing (install libqt6sql6-sqlite)");
      db = QSqlDatabase();
      QSqlDatabase::removeDatabase(name);
      return false;
    }
    db.setDatabaseName(path);
    if (!db.open()) {
      m_lastError = QStringLiteral("cannot open %1: %2").arg(path, db.lastError().text());
      db = QSqlDatabase();
      QSqlDatabase::removeDatabase(name);
      return false;
    }
  }
  m_connection = name;
  return true;
}

bool ConversationStore::checkBeforeWriting(bool existing) {
  if (!existing) return true;
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  // integrity_check reads every page: it fails on a truncated file, a garbage
  // page or a file that is not a database at all.
  if (!q.exec(QStringLiteral("PRAGMA integrity_check"))) {
    m_lastError = QStringLiteral("the file is not a readable SQLite database (%1)").arg(q.lastError().text());
    return false;
  }
  QStringList problems;
  while (q.next()) problems << q.value(0).toString();
  if (problems != QStringList{QStringLiteral("ok")}) {
    m_lastError = QStringLiteral("the database is damaged (integrity check: %1)").arg(problems.mid(0, 3).join(QStringLiteral("; ")));
    return false;
  }
  auto hasTable = [this](const char* table) {
    QSqlQuery t(QSqlDatabase::database(m_connection, false));
    t.prepare(QStringLiteral("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?"));
    t.addBindValue(QString::fromLatin1(table));
    return t.exec() && t.next() && t.value(0).toInt() == 1;
  };
  if (!hasTable("schema_version")) {
    QSqlQuery any(QSqlDatabase::database(m_connection, false));
    if (any.exec(QStringLiteral("SELECT COUNT(*) FROM sqlite_master")) && any.next() && any.value(0).toInt() > 0) {
      m_lastError = QStringLiteral("the file holds other tables but no PhaseLab schema: it is not a PhaseLab conversation database");
      return false;
    }
    return true;  // an empty database: the migrations will create the schema
  }
  const int version = schemaVersion();
  if (version < 0) {
    m_lastError = QStringLiteral("the database's schema version is %1, which no PhaseLab writes: the file is damaged")
                      .arg(version);
    return false;
  }
  if (version > kSchemaVersion) {
    m_lastError = QStringLiteral("the database has schema version %1, newer than this PhaseLab (%2): "
                                 "update PhaseLab or set PHASELAB_DB to another file")
                      .arg(version)
                      .arg(kSchemaVersion);
    return false;
  }
  for (const auto& [since, table] : {std::pair{1, "conversations"}, std::pair{1, "messages"}, std::pair{4, "compare_runs"},
                                  std::pair{5, "serving_runs"}})
    if (version >= since && !hasTable(table)) {
      m_lastError = QStringLiteral("the database is damaged: its table '%1' is missing").arg(QString::fromLatin1(table));
      return false;
    }
  // Columns added to an existing table: without one, every read of the
  // table would fail and the conversations would look empty.
  for (const auto& [since, table, column] : {std::tuple{6, "messages", "reasoning"}}) {
    if (version < since) continue;
    QSqlQuery c(QSqlDatabase::database(m_connection, false));
    c.prepare(QStringLiteral("SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?"));
    c.addBindValue(QString::fromLatin1(table));
    c.addBindValue(QString::fromLatin1(column));
    if (!c.exec() || !c.next() || c.value(0).toInt() != 1) {
      m_lastError = QStringLiteral("the database is damaged: its table '%1' has no column '%2'")
                        .arg(QString::fromLatin1(table), QString::fromLatin1(column));
      return false;
    }
  }
  return true;
}

QString ConversationStore::moveAside(const QString& path, QString* error) {
  const QString aside = QStringLiteral("%1.damaged-%2").arg(path, QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-HHmmss")));
  if (!QFile::rename(path, aside) && !QDir().rename(path, aside)) {
    if (error) *error = QStringLiteral("cannot rename %1 (is its folder writable?)").arg(path);
    return {};
  }
  // The WAL and shared-memory files belong to the damaged database.
  for (const char* suffix : {"-wal", "-shm"})
    if (QFile::exists(path + QLatin1String(suffix))) QFile::rename(path + QLatin1String(suffix), aside + QLatin1String(suffix));
  return aside;
}

void ConversationStore::close() {
  if (m_connection.isEmpty()) return;
  {
    QSqlDatabase db = QSqlDatabase::database(m_connection, false);
    if (db.isOpen()) db.close();
  }
  QSqlDatabase::removeDatabase(m_connection);
  m_connection.clear();
}

// A prepared statement run; on failure its error kept for lastError().
bool ConversationStore::run(QSqlQuery& q) {
  if (q.exec()) return true;
  m_lastError = q.lastError().text();
  return false;
}

bool ConversationStore::exec(const QString& sql) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  if (!q.exec(sql)) {
    m_lastError = QStringLiteral("%1: %2").arg(sql.left(60), q.lastError().text());
    spdlog::warn("conversation store: {}", m_lastError.toStdString());
    return false;
  }
  return true;
}

int ConversationStore::schemaVersion() const {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  if (!q.exec(QStringLiteral("SELECT version FROM schema_version")) || !q.next()) return 0;
  return q.value(0).toInt();
}

bool ConversationStore::migrate() {
  if (!exec(QStringLiteral("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"))) return false;
  int version = schemaVersion();
  if (version == 0) {
    QSqlQuery q(QSqlDatabase::database(m_connection, false));
    q.exec(QStringLiteral("SELECT COUNT(*) FROM schema_version"));
    if (q.next() && q.value(0).toInt() == 0 && !exec(QStringLiteral("INSERT INTO schema_version VALUES (0)")))
      return false;
  }
  if (version < 0 || version > kSchemaVersion) {  // checkBeforeWriting() said why
    m_lastError = QStringLiteral("unexpected schema version %1").arg(version);
    return false;
  }
  QSqlDatabase db = QSqlDatabase::database(m_connection, false);
  for (; version < kSchemaVersion; version++) {
    db.transaction();
    bool ok = true;
    for (const QString& stmt : QString::fromUtf8(kMigrations[version]).split(';', Qt::SkipEmptyParts)) {
      if (stmt.trimmed().isEmpty()) continue;
      if (!exec(stmt)) {
        ok = false;
        break;
      }
    }
    ok = ok && exec(QStringLiteral("UPDATE schema_version SET version = %1").arg(version + 1));
    if (!ok) {
      db.rollback();
      m_lastError = QStringLiteral("migration to schema version %1 failed: %2").arg(version + 1).arg(m_lastError);
      return false;
    }
    db.commit();
  }
  return true;
}

QList<ConversationRecord> ConversationStore::conversations(const QString& filter) const {
  QList<ConversationRecord> out;
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  // The search matches titles, message text and reasoning.
  q.prepare(QStringLiteral(
      "SELECT id, title, created_at, updated_at FROM conversations WHERE :f = '' OR title LIKE :p ESCAPE '\\' "
      "OR id IN (SELECT conversation_id FROM messages WHERE content LIKE :p ESCAPE '\\' "
      "OR reasoning LIKE :p ESCAPE '\\') "
      "ORDER BY updated_at DESC, id DESC"));
  QString pattern = filter;
  pattern.replace('\\', QStringLiteral("\\\\")).replace('%', QStringLiteral("\\%")).replace('_', QStringLiteral("\\_"));
  q.bindValue(QStringLiteral(":f"), filter);
  q.bindValue(QStringLiteral(":p"), QStringLiteral("%") + pattern + QStringLiteral("%"));
  if (!q.exec()) {
    spdlog::warn("conversation store: listing failed: {}", q.lastError().text().toStdString());
    return out;
  }
  while (q.next()) {
    bool ok = false;
    ConversationRecord r;
    r.id = q.value(0).toLongLong(&ok);
    if (!ok || r.id <= 0) {
      spdlog::warn("conversation store: skipping a conversation row with a bad id");
      continue;
    }
    r.title = q.value(1).toString();
    r.createdAt = QDateTime::fromMSecsSinceEpoch(q.value(2).toLongLong());
    r.updatedAt = QDateTime::fromMSecsSinceEpoch(q.value(3).toLongLong());
    out.push_back(r);
  }
  return out;
}

ConversationRecord ConversationStore::conversation(qint64 id) const {
  ConversationRecord r;
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("SELECT title, created_at, updated_at FROM conversations WHERE id = ?"));
  q.addBindValue(id);
  if (!q.exec() || !q.next()) return r;
  r.id = id;
  r.title = q.value(0).toString();
  r.createdAt = QDateTime::fromMSecsSinceEpoch(q.value(1).toLongLong());
  r.updatedAt = QDateTime::fromMSecsSinceEpoch(q.value(2).toLongLong());
  return r;
}

qint64 ConversationStore::createConversation(const QString& title, const ConversationSettings& settings) {
  if (const QString bad = settings.validate(); !bad.isEmpty()) {
    m_lastError = bad;
    return 0;
  }
  const qint64 now = nowMs();
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("INSERT INTO conversations (title, created_at, updated_at, mode, system_prompt, template) "
                           "VALUES (?, ?, ?, ?, ?, ?)"));
  q.addBindValue(title.isNull() ? QStringLiteral("") : title);
  q.addBindValue(now);
  q.addBindValue(now);
  q.addBindValue(settings.mode);
  q.addBindValue(textOrNull(settings.hasSystemPrompt, settings.systemPrompt));
  q.addBindValue(textOrNull(!settings.chatTemplate.isEmpty(), settings.chatTemplate));
  if (!run(q)) return 0;
  return q.lastInsertId().toLongLong();
}

ConversationSettings ConversationStore::conversationSettings(qint64 id) const {
  ConversationSettings s;
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("SELECT mode, system_prompt, template FROM conversations WHERE id = ?"));
  q.addBindValue(id);
  if (!q.exec() || !q.next()) return s;
  const QString mode = q.value(0).toString();
  if (ConversationSettings::modeNames().contains(mode)) {
    s.mode = mode;
  } else {
    spdlog::warn("conversation store: conversation {} has unknown mode '{}', using chat", id, mode.toStdString());
  }
  s.hasSystemPrompt = !q.isNull(1);
  s.systemPrompt = s.hasSystemPrompt ? q.value(1).toString() : QString();
  const QString tmpl = q.value(2).toString();
  if (tmpl.isEmpty() || ConversationSettings::templateNames().contains(tmpl)) {
    s.chatTemplate = tmpl;
  } else {
    spdlog::warn("conversation store: conversation {} has unknown template '{}', using the model's own", id,
                 tmpl.toStdString());
  }
  return s;
}

bool ConversationStore::setConversationSettings(qint64 id, const ConversationSettings& settings) {
  if (const QString bad = settings.validate(); !bad.isEmpty()) {
    m_lastError = bad;
    return false;
  }
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("UPDATE conversations SET mode = ?, system_prompt = ?, template = ? WHERE id = ?"));
  q.addBindValue(settings.mode);
  q.addBindValue(textOrNull(settings.hasSystemPrompt, settings.systemPrompt));
  q.addBindValue(textOrNull(!settings.chatTemplate.isEmpty(), settings.chatTemplate));
  q.addBindValue(id);
  if (!run(q)) return false;
  if (q.numRowsAffected() != 1) {
    m_lastError = QStringLiteral("no conversation %1").arg(id);
    return false;
  }
  return true;
}

bool ConversationStore::insertConversations(const QList<ConversationData>& items, QList<qint64>* ids) {
  QList<qint64> created;
  for (const ConversationData& item : items)
    if (const QString bad = item.settings.validate(); !bad.isEmpty()) {
      m_lastError = bad;
      return false;
    }
  QSqlDatabase db = QSqlDatabase::database(m_connection, false);
  if (!db.transaction()) {
    m_lastError = QStringLiteral("cannot start a transaction: %1").arg(db.lastError().text());
    return false;
  }
  auto fail = [&](const QSqlQuery& q) {
    m_lastError = q.lastError().text();
    db.rollback();
    spdlog::warn("conversation store: import failed, nothing written: {}", m_lastError.toStdString());
    return false;
  };
  const qint64 now = nowMs();
  for (const ConversationData& item : items) {
    QSqlQuery c(db);
    c.prepare(QStringLiteral("INSERT INTO conversations (title, created_at, updated_at, mode, system_prompt, template) "
                             "VALUES (?, ?, ?, ?, ?, ?)"));
    c.addBindValue(item.record.title.isNull() ? QStringLiteral("") : item.record.title);
    c.addBindValue(item.record.createdAt.isValid() ? item.record.createdAt.toMSecsSinceEpoch() : now);
    c.addBindValue(now);
    c.addBindValue(item.settings.mode);
    c.addBindValue(textOrNull(item.settings.hasSystemPrompt, item.settings.systemPrompt));
    c.addBindValue(textOrNull(!item.settings.chatTemplate.isEmpty(), item.settings.chatTemplate));
    if (!c.exec()) return fail(c);
    const qint64 id = c.lastInsertId().toLongLong();
    QSqlQuery m(db);
    m.prepare(QStringLiteral("INSERT INTO messages (conversation_id, role, content, state, stats, reasoning, created_at) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)"));
    for (const MessageRecord& msg : item.messages) {
      m.addBindValue(id);
      m.addBindValue(msg.role);
      m.addBindValue(msg.content.isNull() ? QStringLiteral("") : msg.content);
      m.addBindValue(msg.state.isEmpty() ? QStringLiteral("done") : msg.state);
      m.addBindValue(msg.hasStats ? QVariant(QString::fromUtf8(QJsonDocument(msg.stats.toJson()).toJson(QJsonDocument::Compact)))
                                  : QVariant(QString()));
      m.addBindValue(textOrNull(!msg.reasoning.isEmpty(), msg.reasoning));
      m.addBindValue(now);
      if (!m.exec()) return fail(m);
    }
    created.push_back(id);
  }
  if (!db.commit()) {
    m_lastError = QStringLiteral("commit failed: %1").arg(db.lastError().text());
    db.rollback();
    return false;
  }
  if (ids) *ids = created;
  return true;
}

bool ConversationStore::renameConversation(qint64 id, const QString& title) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("UPDATE conversations SET title = ? WHERE id = ?"));
  q.addBindValue(title);
  q.addBindValue(id);
  return q.exec() && q.numRowsAffected() == 1;
}

bool ConversationStore::deleteConversation(qint64 id) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("DELETE FROM conversations WHERE id = ?"));
  q.addBindValue(id);
  return q.exec() && q.numRowsAffected() == 1;
}

QList<MessageRecord> ConversationStore::messages(qint64 conversationId) const {
  QList<MessageRecord> out;
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("SELECT id, role, content, state, stats, typeof(content), reasoning, typeof(reasoning) FROM messages "
                           "WHERE conversation_id = ? ORDER BY id"));
  q.addBindValue(conversationId);
  if (!q.exec()) {
    spdlog::warn("conversation store: reading messages failed: {}", q.lastError().text().toStdString());
    return out;
  }
  while (q.next()) {
    MessageRecord m;
    m.id = q.value(0).toLongLong();
    m.conversationId = conversationId;
    m.role = q.value(1).toString();
    m.content = q.value(2).toString();
    m.state = q.value(3).toString();
    // Skip what the chat cannot show rather than refusing the conversation.
    if (m.role != QLatin1String("user") && m.role != QLatin1String("assistant") && m.role != QLatin1String("system")) {
      spdlog::warn("conversation store: skipping message {} with unknown role '{}'", m.id, m.role.toStdString());
      continue;
    }
    if (q.value(5).toString() != QLatin1String("text")) {
      spdlog::warn("conversation store: skipping message {}: content is {} instead of text", m.id,
                   q.value(5).toString().toStdString());
      continue;
    }
    const QString reasoningType = q.value(7).toString();
    if (reasoningType == QLatin1String("text")) {
      m.reasoning = q.value(6).toString();
    } else if (reasoningType != QLatin1String("null")) {
      spdlog::warn("conversation store: message {} has reasoning of type {}, showing it without", m.id,
                   reasoningType.toStdString());
    }
    const QString stats = q.value(4).toString();
    if (!stats.isEmpty()) {
      QJsonParseError err;
      const QJsonDocument doc = QJsonDocument::fromJson(stats.toUtf8(), &err);
      if (err.error == QJsonParseError::NoError && doc.isObject()) {
        m.stats = RequestStats::fromJson(doc.object());
        m.hasStats = true;
      } else {
        spdlog::warn("conversation store: message {} has unreadable stats, showing it without", m.id);
      }
    }
    out.push_back(m);
  }
  return out;
}

void ConversationStore::touchConversation(qint64 id) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("UPDATE conversations SET updated_at = ? WHERE id = ?"));
  q.addBindValue(nowMs());
  q.addBindValue(id);
  q.exec();
}

qint64 ConversationStore::addMessage(qint64 conversationId, const QString& role, const QString& content,
                                     const QString& state) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("INSERT INTO messages (conversation_id, role, content, state, created_at) VALUES (?, ?, ?, ?, ?)"));
  q.addBindValue(conversationId);
  q.addBindValue(role);
  q.addBindValue(content.isNull() ? QStringLiteral("") : content);  // a null QString binds as SQL NULL
  q.addBindValue(state);
  q.addBindValue(nowMs());
  if (!run(q)) {
    spdlog::warn("conversation store: adding a message failed: {}", m_lastError.toStdString());
    return 0;
  }
  touchConversation(conversationId);
  return q.lastInsertId().toLongLong();
}

bool ConversationStore::updateMessage(qint64 id, const QString& content, const QString& state) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("UPDATE messages SET content = ?, state = ? WHERE id = ?"));
  q.addBindValue(content.isNull() ? QStringLiteral("") : content);
  q.addBindValue(state);
  q.addBindValue(id);
  return run(q);
}

bool ConversationStore::updateAnswer(qint64 id, const QString& content, const QString& reasoning, const QString& state) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("UPDATE messages SET content = ?, reasoning = ?, state = ? WHERE id = ?"));
  q.addBindValue(content.isNull() ? QStringLiteral("") : content);
  q.addBindValue(textOrNull(!reasoning.isEmpty(), reasoning));
  q.addBindValue(state);
  q.addBindValue(id);
  return run(q);
}

bool ConversationStore::finishMessage(qint64 id, const QString& content, const QString& state,
                                      const RequestStats& stats, const QString& reasoning) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("UPDATE messages SET content = ?, state = ?, stats = ?, reasoning = ? WHERE id = ?"));
  q.addBindValue(content.isNull() ? QStringLiteral("") : content);
  q.addBindValue(state);
  q.addBindValue(QString::fromUtf8(QJsonDocument(stats.toJson()).toJson(QJsonDocument::Compact)));
  q.addBindValue(textOrNull(!reasoning.isEmpty(), reasoning));
  q.addBindValue(id);
  return run(q);
}

bool ConversationStore::deleteMessage(qint64 id) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("DELETE FROM messages WHERE id = ?"));
  q.addBindValue(id);
  return q.exec();
}

bool ConversationStore::deleteMessagesAfter(qint64 conversationId, qint64 id) {
  QSqlQuery q(QSqlDatabase::database(m_connection, false));
  q.prepare(QStringLiteral("DELETE FROM messages WHERE conversation_id = ? AND id > ?"));
  q.addBindValue(conversationId);
  q.addBindValue(id);
  return q.exec();
}

// The Compare window's and the Serving lab's saved runs share one shape:
// title, options and rows as JSON, in a table of their own.
qint64 ConversationStore::saveRun(const char* table, const QString& title, const QByteArray& options,
                                  const QByteArray& rows) {
  QSqlQuery q(QSqlDatabase::database(m_connection));
  q.prepare(QStringLiteral("INSERT INTO %1 (created_at, title, options, rows) VALUES (?, ?, ?, ?)").arg(QLatin1String(table)));
  q.addBindValue(nowMs());
  q.addBindValue(title);
  q.addBindValue(QString::fromUtf8(options));
  q.addBindValue(QString::fromUtf8(rows));
  if (!run(q)) return 0;
  return q.lastInsertId().toLongLong();
}

QList<CompareRunRecord> ConversationStore::runs(const char* table) const {
  QList<CompareRunRecord> out;
  QSqlQuery q(QSqlDatabase::database(m_connection));
  if (!q.exec(QStringLiteral("SELECT id, created_at, title, options, rows FROM %1 ORDER BY id DESC").arg(QLatin1String(table))))
    return out;
  while (q.next()) {
    CompareRunRecord r;
    r.id = q.value(0).toLongLong();
    r.createdAt = QDateTime::fromMSecsSinceEpoch(q.value(1).toLongLong());
    r.title = q.value(2).toString();
    r.options = q.value(3).toString().toUtf8();
    r.rows = q.value(4).toString().toUtf8();
    out.push_back(r);
  }
  return out;
}

bool ConversationStore::deleteRun(const char* table, qint64 id) {
  QSqlQuery q(QSqlDatabase::database(m_connection));
  q.prepare(QStringLiteral("DELETE FROM %1 WHERE id = ?").arg(QLatin1String(table)));
  q.addBindValue(id);
  if (!run(q)) return false;
  return q.numRowsAffected() > 0;
}

qint64 ConversationStore::saveCompareRun(const QString& title, const QByteArray& options, const QByteArray& rows) {
  return saveRun("compare_runs", title, options, rows);
}
QList<CompareRunRecord> ConversationStore::compareRuns() const { return runs("compare_runs"); }
bool ConversationStore::deleteCompareRun(qint64 id) { return deleteRun("compare_runs", id); }

qint64 ConversationStore::saveServingRun(const QString& title, const QByteArray& options, const QByteArray& result) {
  return saveRun("serving_runs", title, options, result);
}
QList<ServingRunRecord> ConversationStore::servingRuns() const { return runs("serving_runs"); }
bool ConversationStore::deleteServingRun(qint64 id) { return deleteRun("serving_runs", id); }

}  // namespace phaselab::ui
