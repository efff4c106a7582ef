// ConversationStore: persistence across restarts and kills, migrations,
// tolerance of bad rows.
#include <QApplication>
#include <QCryptographicHash>
#include <QDir>
#include <QFile>
#include <QLabel>
#include <QSignalSpy>
#include <QProcess>
#include <QRandomGenerator>
#include <unistd.h>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QTest>
#include <QToolButton>

#include "chat_session.h"
#include "conversation_store.h"
#include "engine_controller.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "message_widget.h"
#include "chat_view.h"

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

QByteArray fileHash(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  return QCryptographicHash::hash(f.readAll(), QCryptographicHash::Sha256);
}

// A closed, checkpointed database with one conversation (the data in the
// main file, not in the WAL).
void writeGoodDb(const QString& path) {
  ConversationStore s;
  QVERIFY(s.open(path));
  const qint64 c = s.createConversation(QStringLiteral("kept"));
  for (int i = 0; i < 40; i++) s.addMessage(c, QStringLiteral("user"), QString(400, QChar(u'a' + i % 26)));
  s.close();
  RawDb raw(path);
  raw.exec(QStringLiteral("PRAGMA wal_checkpoint(TRUNCATE)"));
  raw.exec(QStringLiteral("PRAGMA journal_mode=DELETE"));
}

}  // namespace

class TestGuiStore : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;
  QString freshPath() { return m_dir.filePath(QStringLiteral("db%1.sqlite").arg(++m_n)); }
  static MainWindow::Options windowOn(const QString& path) { return testing::windowOptions(path); }
  // The window shown with the stories model loaded (one thread) and greedy
  // answers of at most maxTokens; whether the model became ready.
  static bool showWithStories(MainWindow& w, int maxTokens, bool ignoreEos = false) {
    w.show();
    if (!testing::loadStories(w)) return false;
    GenerationSettings g;
    g.temperature = 0;
    g.maxTokens = maxTokens;
    g.ignoreEos = ignoreEos;
    w.setGenerationSettings(g);
    return true;
  }

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
    QCOMPARE(s.schemaVersion(), ConversationStore::kSchemaVersion);
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

  // Each way a database can be unusable: open() refuses it without writing
  // a byte, the window chats in memory, says "not saved", and can move the
  // file aside and start a fresh one.
  void unusable_database_never_blocks_chatting_data() {
    QTest::addColumn<QString>("damage");
    QTest::addColumn<QString>("message");
    for (const char* d : {"version -1", "version -5", "newer schema", "missing table", "truncated", "garbage page",
                          "not a database", "folder in its place"})
      QTest::newRow(d) << QString::fromLatin1(d) << QString();
  }
  void unusable_database_never_blocks_chatting() {
    QFETCH(QString, damage);
    const QString path = freshPath();
    if (damage == QLatin1String("folder in its place")) {
      QVERIFY(QDir().mkpath(path));
    } else if (damage == QLatin1String("not a database")) {
      QFile f(path);
      QVERIFY(f.open(QIODevice::WriteOnly));
      for (int i = 0; i < 4096; i++) f.putChar(char(QRandomGenerator::global()->generate()));
    } else {
      writeGoodDb(path);
      RawDb raw(path);
      if (damage.startsWith(QLatin1String("version "))) {
        QVERIFY(raw.exec(QStringLiteral("UPDATE schema_version SET version = %1").arg(damage.mid(8))));
      } else if (damage == QLatin1String("newer schema")) {
        QVERIFY(raw.exec(QStringLiteral("UPDATE schema_version SET version = 99")));
      } else if (damage == QLatin1String("missing table")) {
        QVERIFY(raw.exec(QStringLiteral("DROP TABLE messages")));
      }
    }
    if (damage == QLatin1String("truncated") || damage == QLatin1String("garbage page")) {
      QFile f(path);
      QVERIFY(f.open(QIODevice::ReadWrite));
      const qint64 size = f.size();
      QVERIFY(size >= 4 * 4096);
      if (damage == QLatin1String("truncated")) {
        QVERIFY(f.resize(size / 2));
      } else {
        QVERIFY(f.seek(2 * 4096));
        QByteArray junk(4096, '\0');
        for (char& c : junk) c = char(QRandomGenerator::global()->generate());
        f.write(junk);
      }
    }
    const QByteArray before = fileHash(path);

    ConversationStore s;
    QVERIFY2(!s.open(path), qPrintable(damage + QStringLiteral(": opened")));
    QVERIFY(!s.lastError().isEmpty());
    QCOMPARE(fileHash(path), before);  // not a byte written

    {
      MainWindow w(windowOn(path));
      w.show();
      QVERIFY(w.isStoreWarningShown());
      QVERIFY(w.isNotSavedShown());
      QVERIFY(w.store()->isOpen() && !w.store()->isPersistent());
      // Chatting goes on, in memory.
      const qint64 c = w.store()->createConversation(QStringLiteral("in memory"));
      QVERIFY(c > 0);
      QVERIFY(w.store()->addMessage(c, QStringLiteral("user"), QStringLiteral("hello")) > 0);
      QCOMPARE(fileHash(path), before);

      w.moveDatabaseAside();
      QVERIFY(!w.isStoreWarningShown());
      QVERIFY(!w.isNotSavedShown());
      QVERIFY(w.store()->isPersistent());
    }
    // The damaged file is kept, byte for byte, beside a fresh database.
    const QStringList aside = QDir(QFileInfo(path).absolutePath())
                                  .entryList({QFileInfo(path).fileName() + QStringLiteral(".damaged-*")});
    QCOMPARE(aside.size(), 1);
    const QString kept = QFileInfo(path).absolutePath() + QLatin1Char('/') + aside.front();
    if (!before.isEmpty()) QCOMPARE(fileHash(kept), before);
    ConversationStore fresh;
    QVERIFY2(fresh.open(path), qPrintable(fresh.lastError()));
    QCOMPARE(fresh.schemaVersion(), ConversationStore::kSchemaVersion);
  }

  void read_only_database_is_not_written() {
    if (::geteuid() == 0) QSKIP("running as root, which can write a read-only file");
    const QString path = freshPath();
    writeGoodDb(path);
    QVERIFY(QFile::setPermissions(path, QFile::ReadOwner | QFile::ReadUser));
    const QByteArray before = fileHash(path);
    ConversationStore s;
    QVERIFY(!s.open(path));
    QVERIFY2(s.lastError().contains(QLatin1String("cannot be written")), qPrintable(s.lastError()));
    QCOMPARE(fileHash(path), before);
  }

  // A chat goes through, with a model, while the database is unusable.
  void send_works_when_the_database_cannot_be_used() {
    const QString path = freshPath();
    QVERIFY(QDir().mkpath(path));  // a folder where the file should be
    MainWindow w(windowOn(path));
    QVERIFY(showWithStories(w, 8));
    QSignalSpy finished(w.chatSession(), &ChatSession::answerFinished);
    QVERIFY2(w.sendMessage(QStringLiteral("Once upon a time")), qPrintable(w.lastError()));
    QVERIFY(finished.wait(30000));
    const MessageRecord answer = finished.last().at(1).value<MessageRecord>();
    QVERIFY2(answer.state != QLatin1String("error"), qPrintable(answer.stats.error));
    QVERIFY(!answer.content.isEmpty());
    QVERIFY(QFileInfo(path).isDir());
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

  // A version-2 database as that release wrote it: migration 2 -> 3 keeps
  // every row and gives each conversation the default settings.
  void version_2_database_gets_default_conversation_settings() {
    const QString path = freshPath();
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE schema_version (version INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO schema_version VALUES (2)")));
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
                                      "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL "
                                      "REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT "
                                      "NOT NULL, state TEXT NOT NULL DEFAULT 'done', stats TEXT, created_at INTEGER NOT NULL)")));
      QVERIFY(raw.exec(QStringLiteral("CREATE INDEX messages_by_conversation ON messages(conversation_id, id)")));
      QVERIFY(raw.exec(QStringLiteral("CREATE INDEX conversations_by_update ON conversations(updated_at DESC)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO conversations VALUES (7, 'seven', 1000, 5000)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO conversations VALUES (8, 'eight', 2000, 3000)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (7, 'user', 'hi', 1)")));
      QVERIFY(raw.exec(QStringLiteral("INSERT INTO messages (conversation_id, role, content, state, stats, created_at) "
                                      "VALUES (7, 'assistant', 'hello', 'stopped', '{\"n_generated\":4}', 2)")));
    }
    ConversationStore s;
    QVERIFY2(s.open(path), qPrintable(s.lastError()));
    QCOMPARE(s.schemaVersion(), ConversationStore::kSchemaVersion);
    const auto convs = s.conversations();
    QCOMPARE(convs.size(), 2);
    QCOMPARE(convs[0].id, 7);
    QCOMPARE(convs[0].title, QStringLiteral("seven"));
    QCOMPARE(convs[0].createdAt.toMSecsSinceEpoch(), 1000);
    QCOMPARE(convs[0].updatedAt.toMSecsSinceEpoch(), 5000);
    QCOMPARE(convs[1].title, QStringLiteral("eight"));
    const auto msgs = s.messages(7);
    QCOMPARE(msgs.size(), 2);
    QCOMPARE(msgs[1].content, QStringLiteral("hello"));
    QCOMPARE(msgs[1].state, QStringLiteral("stopped"));
    QCOMPARE(msgs[1].stats.nGenerated, 4);
    for (qint64 id : {7, 8}) {
      const ConversationSettings cs = s.conversationSettings(id);
      QCOMPARE(cs.mode, QStringLiteral("chat"));
      QVERIFY(!cs.hasSystemPrompt);
      QVERIFY(cs.chatTemplate.isEmpty());
      QCOMPARE(cs, ConversationSettings{});
    }
    RawDb raw(path);
    QCOMPARE(raw.value(QStringLiteral("SELECT mode FROM conversations WHERE id = 8")).toString(), QStringLiteral("chat"));
    QVERIFY(raw.value(QStringLiteral("SELECT system_prompt IS NULL AND template IS NULL FROM conversations WHERE id = 8")).toBool());
  }

  void conversation_settings_round_trip() {
    const QString path = freshPath();
    ConversationSettings notebook;
    notebook.mode = QStringLiteral("notebook");
    notebook.chatTemplate = QStringLiteral("plain-fewshot");
    ConversationSettings prompted;
    prompted.hasSystemPrompt = true;
    prompted.systemPrompt = QStringLiteral("Answer in French.\nBriefly.");
    prompted.chatTemplate = QStringLiteral("llama3");
    ConversationSettings emptyPrompt;  // set, but empty: no system prompt at all, not the default
    emptyPrompt.hasSystemPrompt = true;
    qint64 a = 0, b = 0, c = 0, d = 0;
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      a = s.createConversation(QStringLiteral("notebook"), notebook);
      b = s.createConversation(QStringLiteral("prompted"), prompted);
      c = s.createConversation(QStringLiteral("empty prompt"), emptyPrompt);
      d = s.createConversation(QStringLiteral("default"));
      QVERIFY(a > 0 && b > 0 && c > 0 && d > 0);
      QCOMPARE(s.conversationSettings(a), notebook);
      // Changing them: back to the defaults, and from the defaults.
      QVERIFY(s.setConversationSettings(a, ConversationSettings{}));
      QVERIFY(s.setConversationSettings(d, notebook));
    }
    ConversationStore s;
    QVERIFY(s.open(path));
    QCOMPARE(s.conversationSettings(a), ConversationSettings{});
    QCOMPARE(s.conversationSettings(b), prompted);
    QCOMPARE(s.conversationSettings(c), emptyPrompt);
    QVERIFY(s.conversationSettings(c).hasSystemPrompt);
    QCOMPARE(s.conversationSettings(d), notebook);
    QCOMPARE(s.conversationSettings(b).systemPrompt, QStringLiteral("Answer in French.\nBriefly."));

    // Invalid settings are refused with the field named, and change nothing.
    ConversationSettings bad;
    bad.mode = QStringLiteral("poetry");
    QVERIFY(!s.setConversationSettings(b, bad));
    QVERIFY2(s.lastError().contains(QLatin1String("mode")), qPrintable(s.lastError()));
    QCOMPARE(s.createConversation(QStringLiteral("bad"), bad), 0);
    bad = {};
    bad.chatTemplate = QStringLiteral("vicuna");
    QVERIFY(!s.setConversationSettings(b, bad));
    QVERIFY2(s.lastError().contains(QLatin1String("template")), qPrintable(s.lastError()));
    QCOMPARE(s.conversationSettings(b), prompted);
    QCOMPARE(s.conversations().size(), 4);
    QVERIFY(!s.setConversationSettings(9999, notebook));  // no such conversation

    // A value no PhaseLab writes, put in by hand: the defaults, not a failure.
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("UPDATE conversations SET mode = 'rap', template = 'vicuna' WHERE id = %1").arg(d)));
    }
    QCOMPARE(s.conversationSettings(d).mode, QStringLiteral("chat"));
    QVERIFY(s.conversationSettings(d).chatTemplate.isEmpty());
  }

  // Compare window runs (schema 4): saved, listed newest first, kept across
  // a reopen, deleted; a version-4 file without the table is damaged.
  void compare_runs_round_trip() {
    const QString path = freshPath();
    qint64 first = 0, second = 0;
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      QVERIFY(s.schemaVersion() >= 4);
      first = s.saveCompareRun(QStringLiteral("run one"), "{\"chunks\":8}", "[{\"name\":\"a\",\"tg128\":1}]");
      second = s.saveCompareRun(QStringLiteral("run two"), "{}", "[]");
      QVERIFY(first > 0 && second > first);
    }
    ConversationStore s;
    QVERIFY(s.open(path));
    const auto runs = s.compareRuns();
    QCOMPARE(runs.size(), 2);
    QCOMPARE(runs[0].id, second);
    QCOMPARE(runs[1].title, QStringLiteral("run one"));
    QCOMPARE(runs[1].options, QByteArray("{\"chunks\":8}"));
    QCOMPARE(runs[1].rows, QByteArray("[{\"name\":\"a\",\"tg128\":1}]"));
    QVERIFY(s.deleteCompareRun(first));
    QVERIFY(!s.deleteCompareRun(first));
    QCOMPARE(s.compareRuns().size(), 1);
    s.close();
    {
      QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("drop_compare"));
      db.setDatabaseName(path);
      QVERIFY(db.open());
      QVERIFY(QSqlQuery(db).exec(QStringLiteral("DROP TABLE compare_runs")));
      db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("drop_compare"));
    ConversationStore damaged;
    QVERIFY(!damaged.open(path));
    QVERIFY2(damaged.lastError().contains(QLatin1String("compare_runs")), qPrintable(damaged.lastError()));
  }

  // Serving lab runs (schema 5): saved apart from Compare's, listed newest
  // first, deleted; a version-4 file gains the table and keeps its Compare
  // runs; a version-5 file without it is damaged.
  void serving_runs_round_trip() {
    const QString path = freshPath();
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      QCOMPARE(s.schemaVersion(), ConversationStore::kSchemaVersion);
      QVERIFY(s.saveCompareRun(QStringLiteral("compare"), "{}", "[]") > 0);
      const qint64 a = s.saveServingRun(QStringLiteral("lab one"), "{\"streams\":4}", "{\"rows\":[]}");
      const qint64 b = s.saveServingRun(QStringLiteral("lab two"), "{}", "{}");
      QVERIFY(a > 0 && b > a);
      QCOMPARE(s.servingRuns().size(), 2);
      QCOMPARE(s.servingRuns()[0].id, b);
      QCOMPARE(s.servingRuns()[1].options, QByteArray("{\"streams\":4}"));
      QCOMPARE(s.compareRuns().size(), 1);  // apart
      QVERIFY(s.deleteServingRun(a));
      QVERIFY(!s.deleteServingRun(a));
      QCOMPARE(s.servingRuns().size(), 1);
    }
    // Back to what PhaseLab with schema 4 wrote.
    {
      QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("to_v4"));
      db.setDatabaseName(path);
      QVERIFY(db.open());
      QVERIFY(QSqlQuery(db).exec(QStringLiteral("DROP TABLE serving_runs")));
      QVERIFY(QSqlQuery(db).exec(QStringLiteral("ALTER TABLE messages DROP COLUMN reasoning")));
      QVERIFY(QSqlQuery(db).exec(QStringLiteral("UPDATE schema_version SET version = 4")));
      db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("to_v4"));
    {
      ConversationStore s;
      QVERIFY2(s.open(path), qPrintable(s.lastError()));
      QCOMPARE(s.schemaVersion(), ConversationStore::kSchemaVersion);
      QCOMPARE(s.compareRuns().size(), 1);
      QCOMPARE(s.servingRuns().size(), 0);
      QVERIFY(s.saveServingRun(QStringLiteral("after upgrade"), "{}", "{}") > 0);
    }
    {
      QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("drop_serving"));
      db.setDatabaseName(path);
      QVERIFY(db.open());
      QVERIFY(QSqlQuery(db).exec(QStringLiteral("DROP TABLE serving_runs")));
      db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("drop_serving"));
    ConversationStore damaged;
    QVERIFY(!damaged.open(path));
    QVERIFY2(damaged.lastError().contains(QLatin1String("serving_runs")), qPrintable(damaged.lastError()));
  }

  // Schema 6: an answer's reasoning is saved beside its text (NULL when
  // there is none), found by the search, and kept by a reopen; a version-5
  // file gains the column and keeps its rows; a version-6 file without the
  // column is refused as damaged, and left as it was.
  void reasoning_round_trip_and_migration() {
    const QString path = freshPath();
    qint64 conv = 0, user = 0, answer = 0, plain = 0;
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      conv = s.createConversation(QStringLiteral("weather"));
      user = s.addMessage(conv, QStringLiteral("user"), QStringLiteral("Rain tomorrow?"));
      answer = s.addMessage(conv, QStringLiteral("assistant"), QString(), QStringLiteral("streaming"));
      QVERIFY(s.updateAnswer(answer, QStringLiteral("Prob"), QStringLiteral("The user asks about rain."),
                             QStringLiteral("streaming")));
      QCOMPARE(s.messages(conv)[1].reasoning, QStringLiteral("The user asks about rain."));
      RequestStats st;
      st.nGenerated = 9;
      QVERIFY(s.finishMessage(answer, QStringLiteral("Probably."), QStringLiteral("done"), st,
                              QStringLiteral("The user asks about rain. Barometer falling.")));
      plain = s.addMessage(conv, QStringLiteral("assistant"), QStringLiteral("No reasoning here."));
      QVERIFY(s.finishMessage(plain, QStringLiteral("No reasoning here."), QStringLiteral("done"), st));
    }
    {
      RawDb raw(path);
      QVERIFY(raw.value(QStringLiteral("SELECT reasoning IS NULL FROM messages WHERE id = %1").arg(plain)).toBool());
      QVERIFY(raw.value(QStringLiteral("SELECT reasoning IS NULL FROM messages WHERE id = %1").arg(user)).toBool());
    }
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      const auto msgs = s.messages(conv);
      QCOMPARE(msgs.size(), 3);
      QCOMPARE(msgs[1].content, QStringLiteral("Probably."));
      QCOMPARE(msgs[1].reasoning, QStringLiteral("The user asks about rain. Barometer falling."));
      QCOMPARE(msgs[1].stats.nGenerated, 9);
      QVERIFY(msgs[0].reasoning.isEmpty());
      QVERIFY(msgs[2].reasoning.isEmpty());
      QCOMPARE(s.conversations(QStringLiteral("Barometer")).size(), 1);  // the search reads reasoning too
      QCOMPARE(s.conversations(QStringLiteral("Hygrometer")).size(), 0);
      // A user message's edit leaves no reasoning behind.
      QVERIFY(s.updateMessage(user, QStringLiteral("Snow tomorrow?"), QStringLiteral("done")));
      QVERIFY(s.messages(conv)[0].reasoning.isEmpty());
    }
    // Back to what PhaseLab with schema 5 wrote: the rows stay, the column
    // comes back empty.
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("ALTER TABLE messages DROP COLUMN reasoning")));
      QVERIFY(raw.exec(QStringLiteral("UPDATE schema_version SET version = 5")));
    }
    {
      ConversationStore s;
      QVERIFY2(s.open(path), qPrintable(s.lastError()));
      QCOMPARE(s.schemaVersion(), ConversationStore::kSchemaVersion);
      const auto msgs = s.messages(conv);
      QCOMPARE(msgs.size(), 3);
      QCOMPARE(msgs[1].content, QStringLiteral("Probably."));
      QVERIFY(msgs[1].reasoning.isEmpty());
      QVERIFY(s.finishMessage(answer, QStringLiteral("Probably."), QStringLiteral("done"), msgs[1].stats,
                              QStringLiteral("again")));
      QCOMPARE(s.messages(conv)[1].reasoning, QStringLiteral("again"));
    }
    // A reasoning value no PhaseLab writes (a blob): the message is shown
    // without it.
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("UPDATE messages SET reasoning = X'00FF' WHERE id = %1").arg(answer)));
    }
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      const auto msgs = s.messages(conv);
      QCOMPARE(msgs.size(), 3);
      QCOMPARE(msgs[1].content, QStringLiteral("Probably."));
      QVERIFY(msgs[1].reasoning.isEmpty());
    }
    // Schema 6 without the column: damaged, named, not written.
    {
      RawDb raw(path);
      QVERIFY(raw.exec(QStringLiteral("ALTER TABLE messages DROP COLUMN reasoning")));
      raw.exec(QStringLiteral("PRAGMA wal_checkpoint(TRUNCATE)"));
    }
    const QByteArray before = fileHash(path);
    ConversationStore damaged;
    QVERIFY(!damaged.open(path));
    QVERIFY2(damaged.lastError().contains(QLatin1String("reasoning")), qPrintable(damaged.lastError()));
    QCOMPARE(fileHash(path), before);
  }

  // Through the window: a reasoning model's reasoning (here sent as the
  // engine sends gpt-oss's analysis channel) shows on the answer's card,
  // reaches the database while the answer streams and when it ends, stays
  // out of the answer's text, and is on the card again after a restart.
  void reasoning_is_saved_with_the_streaming_answer() {
    const QString path = freshPath();
    qint64 conv = 0;
    QString answerText;
    {
      MainWindow w(windowOn(path));
      QVERIFY(showWithStories(w, 24, /*ignoreEos=*/true));
      QString savedWhileStreaming, stateWhileStreaming;
      bool injected = false;
      // At the answer's first tokens (before its end can arrive: the
      // engine's signals come in order), as the engine would send it.
      connect(w.engine(), &EngineController::tokensReady, this, [&](int requestId, const QString&, int) {
        if (injected) return;
        injected = true;
        emit w.engine()->reasoningReady(requestId, QStringLiteral("  The user"));
        emit w.engine()->reasoningReady(requestId + 1000, QStringLiteral(" (another request's)"));
        emit w.engine()->reasoningReady(requestId, QStringLiteral(" wants a story."));
        w.chatSession()->flush();
        RawDb raw(path);
        savedWhileStreaming = raw.value(QStringLiteral("SELECT reasoning FROM messages WHERE role = 'assistant'")).toString();
        stateWhileStreaming = raw.value(QStringLiteral("SELECT state FROM messages WHERE role = 'assistant'")).toString();
      });
      QSignalSpy finished(w.chatSession(), &ChatSession::answerFinished);
      QVERIFY2(w.sendMessage(QStringLiteral("Once upon a time")), qPrintable(w.lastError()));
      QVERIFY(finished.wait(30000));
      QVERIFY(injected);
      QCOMPARE(stateWhileStreaming, QStringLiteral("streaming"));
      QCOMPARE(savedWhileStreaming, QStringLiteral("The user wants a story."));
      const MessageRecord answer = finished.last().at(1).value<MessageRecord>();
      QCOMPARE(answer.reasoning, QStringLiteral("The user wants a story."));
      QVERIFY(!answer.content.isEmpty());
      QVERIFY2(!answer.content.contains(QLatin1String("The user wants")), qPrintable(answer.content));
      answerText = answer.content;
      conv = w.chatSession()->conversationId();
      auto cards = w.chatView()->findChildren<MessageWidget*>();
      QCOMPARE(cards.size(), 2);
      QCOMPARE(cards[1]->reasoning(), QStringLiteral("The user wants a story."));
      QCOMPARE(cards[1]->text(), answerText);
    }
    {
      ConversationStore s;
      QVERIFY(s.open(path));
      const auto msgs = s.messages(conv);
      QCOMPARE(msgs.size(), 2);
      QCOMPARE(msgs[1].state, QStringLiteral("done"));
      QCOMPARE(msgs[1].reasoning, QStringLiteral("The user wants a story."));
      QCOMPARE(msgs[1].content, answerText);
    }
    MainWindow w(windowOn(path));
    w.show();
    w.chatSession()->openConversation(conv);
    const auto cards = w.chatView()->findChildren<MessageWidget*>();
    QCOMPARE(cards.size(), 2);
    QVERIFY(cards[0]->reasoning().isEmpty());
    QCOMPARE(cards[1]->reasoning(), QStringLiteral("The user wants a story."));
    // A saved answer's reasoning is closed to its toggle, which opens it.
    auto* line = cards[1]->findChild<QLabel*>(QStringLiteral("messageReasoning"));
    auto* toggle = cards[1]->findChild<QToolButton*>(QStringLiteral("messageReasoningToggle"));
    QVERIFY(line && toggle);
    QVERIFY(toggle->isVisible());
    QVERIFY(!line->isVisible());
    toggle->click();
    QVERIFY(line->isVisible());
    QVERIFY2(line->text().contains(QLatin1String("The user wants a story.")), qPrintable(line->text()));
    QVERIFY(!cards[0]->findChild<QLabel*>(QStringLiteral("messageReasoning"))->isVisible());
    QVERIFY(!cards[0]->findChild<QToolButton*>(QStringLiteral("messageReasoningToggle"))->isVisible());
  }
};

QTEST_MAIN(TestGuiStore)
#include "test_gui_store.moc"
