// ConversationStore: persistence across restarts and kills, migrations,
// tolerance of bad rows.
#include <QFile>
#include <QProcess>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QTest>

#include "conversation_store.h"
#include "gui_test_util.h"

using namespace phaselab::ui;

namespace {

// A second, raw connection for poking at the file the way a broken writer would.
class RawDb {
 public:
  explicit RawDb(const QString& path) : m_name(QStringLiteral("raw-%1").arg(++s_count)) {
    QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), m_name);
    db.setDatabaseName(path);
    db.open();
  }
  ~RawDb() {
    { QSqlDatabase::database(m_name).close(); }
    QSqlDatabase::removeDatabase(m_name);
  }
  bool exec(const QString& sql) {
    QSqlQuery q(QSqlDatabase::database(m_name));
    return q.exec(sql);
  }
  QVariant value(const QString& sql) {
    QSqlQuery q(QSqlDatabase::database(m_name));
    if (!q.exec(sql) || !q.next()) return {};
    return q.value(0);
  }

 private:
  static inline int s_count = 0;
  QString m_name;
};

}  // namespace

class TestGuiStore : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;
  QString freshPath() { return m_dir.filePath(QStringLiteral("db%1.sqlite").arg(++m_n)); }

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_store"); }

  void conversations_survive_reopen() {
    const QString path = freshPath();
    qint64 conv = 0, answer = 0;
    {
      ConversationStore s;
      QVERIFY2(s.open(path), qPrintable(s.lastError()));
      conv = s.createConversation(QStringLiteral("Capitals"));
      QVERIFY(conv > 0);
      QVERIFY(s.addMessage(conv, QStringLiteral("user"), QStringLiteral("Capital of France?")) > 0);
      answer = s.addMessage(conv, QStringLiteral("assistant"), QString(), QStringLiteral("streaming"));
      RequestStats st;
      st.ttftMs = 12.5;
      st.nGenerated = 3;
      st.backend = QStringLiteral("cpu");
      QVERIFY(s.finishMessage(answer, QStringLiteral("**Paris**"), QStringLiteral("done"), st));
    }
    ConversationStore s;
    QVERIFY(s.open(path));
    const auto convs = s.conversations();
    QCOMPARE(convs.size(), 1);
    QCOMPARE(convs[0].title, QStringLiteral("Capitals"));
    const auto msgs = s.messages(conv);
    QCOMPARE(msgs.size(), 2);
    QCOMPARE(msgs[1].content, QStringLiteral("**Paris**"));
    QCOMPARE(msgs[1].state, QStringLiteral("done"));
    QVERIFY(msgs[1].hasStats);
    QCOMPARE(msgs[1].stats.ttftMs, 12.5);
    QCOMPARE(msgs[1].stats.nGenerated, 3);
  }

  void database_is_wal_with_current_schema() {
    const QString path = freshPath();
    ConversationStore s;
    QVERIFY(s.open(path));
    QCOMPARE(s.schemaVersion(), ConversationStore::kSchemaVersion);
    RawDb raw(path);
    QCOMPARE(raw.value(QStringLiteral("PRAGMA journal_mode")).toString(), QStringLiteral("wal"));
  }

  void old_schema_is_migrated() {
    const QString path = freshPath();
    {
      // A version-1 database as the first release wrote it, with data.
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE schema_version (version INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO schema_version VALUES (1)")));
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
                                      "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL "
                                      "REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT "
                                      "NOT NULL, state TEXT NOT NULL DEFAULT 'done', stats TEXT, created_at INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO conversations VALUES (7, 'old', 1, 1)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (7, 'user', 'hi', 1)")));
    }
    ConversationStore s;
    QVERIFY2(s.open(path), qPrintable(s.lastError()));
    QCOMPARE(s.schemaVersion(), 2);
    QCOMPARE(s.messages(7).size(), 1);
    RawDb raw(path);
    QCOMPARE(raw.value(QStringLiteral("SELECT COUNT(*) FROM sqlite_master WHERE name = 'conversations_by_update'")).toInt(), 1);
  }

  void newer_schema_is_refused_with_a_message() {
    const QString path = freshPath();
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE schema_version (version INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO schema_version VALUES (99)")));
    }
    ConversationStore s;
    QVERIFY(!s.open(path));
    QVERIFY2(s.lastError().contains(QStringLiteral("newer")), qPrintable(s.lastError()));
  }

  void bad_rows_are_skipped_not_fatal() {
    const QString path = freshPath();
    qint64 conv = 0;
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      conv = s.createConversation(QStringLiteral("mixed"));
      s.addMessage(conv, QStringLiteral("user"), QStringLiteral("good 1"));
      s.addMessage(conv, QStringLiteral("assistant"), QStringLiteral("good 2"));
    }
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (%1, 'bogus', 'x', 1)").arg(conv)));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (%1, 'user', x'00ff', 1)").arg(conv)));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO messages (conversation_id, role, content, stats, created_at) VALUES (%1, 'assistant', 'good 3', '{broken', 1)").arg(conv)));
    }
    ConversationStore s;
    QVERIFY(s.open(path));
    const auto msgs = s.messages(conv);
    QCOMPARE(msgs.size(), 3);
    QCOMPARE(msgs[0].content, QStringLiteral("good 1"));
    QCOMPARE(msgs[1].content, QStringLiteral("good 2"));
    QCOMPARE(msgs[2].content, QStringLiteral("good 3"));
    QVERIFY(!msgs[2].hasStats);
  }

  void search_rename_delete() {
    ConversationStore s;
    QVERIFY(s.open(freshPath()));
    const qint64 a = s.createConversation(QStringLiteral("Rust lifetimes"));
    const qint64 b = s.createConversation(QStringLiteral("Dinner"));
    s.addMessage(b, QStringLiteral("user"), QStringLiteral("a recipe with 100% butter_x"));
    QCOMPARE(s.conversations(QStringLiteral("rust")).size(), 1);
    QCOMPARE(s.conversations(QStringLiteral("100%")).size(), 1);  // % is literal, not a wildcard
    QCOMPARE(s.conversations(QStringLiteral("butter_x")).first().id, b);
    QVERIFY(s.renameConversation(a, QStringLiteral("Borrowing")));
    QCOMPARE(s.conversations(QStringLiteral("borrow")).first().id, a);
    QVERIFY(s.deleteConversation(b));
    QCOMPARE(s.conversations().size(), 1);
    QCOMPARE(s.messages(b).size(), 0);  // cascaded
  }

  // The real application, killed while it streams a long answer: what it
  // saved must be readable, marked interrupted, and not empty.
  void killed_process_keeps_partial_answer() {
    const QString path = freshPath();
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("PHASELAB_DB"), path);
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    p.setProcessEnvironment(env);
    p.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    // KV cache off: each token recomputes the sequence, so 400 tokens take
    // seconds even with this tiny model, long enough to kill it mid-answer.
    p.start(QStringLiteral(PHASELAB_GUI_PATH),
            {QStringLiteral("--model"), testing::stories(), QStringLiteral("--prompt"), QStringLiteral("Once upon a time"),
             QStringLiteral("--quit"), QStringLiteral("-n"), QStringLiteral("400"), QStringLiteral("--ignore-eos"),
             QStringLiteral("--no-kv-cache"), QStringLiteral("--threads"), QStringLiteral("1")});
    QVERIFY2(p.waitForStarted(10000), qPrintable(p.errorString()));

    QString seen;
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < 30000) {
      QTest::qWait(50);
      if (!QFile::exists(path)) continue;
      RawDb raw(path);
      const QString state = raw.value(QStringLiteral("SELECT state FROM messages WHERE role = 'assistant'")).toString();
      QVERIFY2(state != QLatin1String("done"), "the answer finished before the kill: make it longer");
      seen = raw.value(QStringLiteral("SELECT content FROM messages WHERE role = 'assistant'")).toString();
      if (seen.size() >= 20) break;
    }
    QVERIFY2(seen.size() >= 20, "no partial answer reached the database within 30 s");
    p.kill();
    QVERIFY(p.waitForFinished(10000));
    QCOMPARE(p.exitStatus(), QProcess::CrashExit);

    ConversationStore s;
    QVERIFY(s.open(path));
    const auto convs = s.conversations();
    QCOMPARE(convs.size(), 1);
    const auto msgs = s.messages(convs[0].id);
    QCOMPARE(msgs.size(), 2);
    QCOMPARE(msgs[0].content, QStringLiteral("Once upon a time"));
    QCOMPARE(msgs[1].state, QStringLiteral("interrupted"));
    QVERIFY2(msgs[1].content.startsWith(seen), "the saved answer lost text that had been saved before");
  }
};

QTEST_GUILESS_MAIN(TestGuiStore)
#include "test_gui_store.moc"
