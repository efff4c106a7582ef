// Conversation export (Markdown, JSON) and import, with hostile inputs; the
// appearance settings (theme, font size).
#include <QApplication>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSettings>
#include <QStyle>
#include <QTemporaryDir>
#include <QTest>

#include "appearance.h"
#include "conversation_export.h"
#include "conversation_store.h"
#include "gui_test_util.h"

using namespace phaselab::ui;

namespace {

RequestStats sampleStats() {
  RequestStats st;
  st.nPrompt = 14;
  st.nReused = 3;
  st.nGenerated = 120;
  st.ttftMs = 12.25;
  st.prefillMs = 11.5;
  st.prefillTps = 1217.3913043478262;
  st.decodeMs = 3409.1;
  st.decodeTps = 35.2;
  st.kvUsed = 134;
  st.kvCapacity = 4096;
  st.specDrafted = 40;
  st.specAccepted = 31;
  st.tokensPerPass = 1.775;
  st.stopReason = QStringLiteral("eos");
  st.backend = QStringLiteral("cpu-avx2");
  return st;
}

// A reasoning model's reasoning with what could break a Markdown export: a
// heading, a blank line, a fence it leaves open.
const QString kReasoning = QStringLiteral("# Plan\nThe user wants a borrow.\n\nShow it:\n```\nlet r");

// A conversation with every kind of message, settings off their defaults.
qint64 fillConversation(ConversationStore& s) {
  ConversationSettings cs;
  cs.mode = QStringLiteral("notebook");
  cs.hasSystemPrompt = true;
  cs.systemPrompt = QStringLiteral("You answer in haiku.\nAlways.");
  cs.chatTemplate = QStringLiteral("chatml");
  const qint64 c = s.createConversation(QStringLiteral("Rust *lifetimes* & \"quotes\" — ünïcode 🦀"), cs);
  s.addMessage(c, QStringLiteral("system"), QStringLiteral("be brief"));
  s.addMessage(c, QStringLiteral("user"), QStringLiteral("Show me a borrow:\n\n```rust\nlet r = &x;\n```\n"));
  const qint64 a = s.addMessage(c, QStringLiteral("assistant"), QString(), QStringLiteral("streaming"));
  s.finishMessage(a, QStringLiteral("Here:\n\n```rust\nfn f<'a>(x: &'a str) -> &'a str { x }\n```"),
                  QStringLiteral("done"), sampleStats(), kReasoning);
  s.addMessage(c, QStringLiteral("user"), QString());  // an empty message survives too
  const qint64 b = s.addMessage(c, QStringLiteral("assistant"), QString(), QStringLiteral("streaming"));
  RequestStats stopped;
  stopped.stopReason = QStringLiteral("cancelled");
  stopped.nGenerated = 2;
  stopped.backend = QStringLiteral("cpu");
  s.finishMessage(b, QStringLiteral("Unclosed fence:\n```\nstill code"), QStringLiteral("stopped"), stopped);
  return c;
}

QJsonObject validObject() {
  QJsonObject m;
  m[QStringLiteral("role")] = QStringLiteral("user");
  m[QStringLiteral("content")] = QStringLiteral("hello");
  QJsonObject o;
  o[QStringLiteral("format")] = QStringLiteral("phaselab.conversation");
  o[QStringLiteral("version")] = 1;
  o[QStringLiteral("title")] = QStringLiteral("t");
  o[QStringLiteral("messages")] = QJsonArray{m};
  return o;
}

QByteArray bytes(const QJsonObject& o) { return QJsonDocument(o).toJson(QJsonDocument::Compact); }

// The object with one key set; the same for its first message (Undefined
// removes the key).
QJsonObject withValue(QJsonObject o, const QString& key, const QJsonValue& v) {
  o[key] = v;
  return o;
}
QJsonObject withMessageValue(QJsonObject o, const QString& key, const QJsonValue& v) {
  QJsonArray arr = o[QStringLiteral("messages")].toArray();
  QJsonObject m = arr[0].toObject();
  if (v.isUndefined()) m.remove(key);
  else m[key] = v;
  arr[0] = m;
  o[QStringLiteral("messages")] = arr;
  return o;
}

int countRows(ConversationStore& s) {
  int n = 0;
  for (const ConversationRecord& c : s.conversations()) n += 1 + int(s.messages(c.id).size());
  return n;
}

}  // namespace

class TestGuiExport : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;
  QString freshPath() { return m_dir.filePath(QStringLiteral("db%1.sqlite").arg(++m_n)); }
  QString m_startupStyle;
  QPalette m_startupPalette;

 private slots:
  void initTestCase() {
    testing::isolate(m_dir, "test_gui_export");
    // Remembers the start-up style, palette and font before a test changes them.
    m_startupStyle = QApplication::style()->name();
    m_startupPalette = QApplication::palette();
    Appearance::instance();
  }

  // ---- export / import ----

  void json_export_import_export_is_identical() {
    ConversationStore a;
    QVERIFY2(a.open(freshPath()), qPrintable(a.lastError()));
    const qint64 c = fillConversation(a);
    const QByteArray first = exportConversation(&a, c);
    QVERIFY(!first.isEmpty());

    ConversationStore b;
    QVERIFY(b.open(freshPath()));
    b.createConversation(QStringLiteral("already there"));  // so that the new id differs
    QString error;
    QList<qint64> ids;
    const qint64 imported = importJson(&b, first, &error, &ids);
    QVERIFY2(imported > 0, qPrintable(error));
    QCOMPARE(ids, QList<qint64>{imported});
    QVERIFY(imported != c);
    QCOMPARE(exportConversation(&b, imported), first);

    // What came back is the conversation, not only the same bytes.
    QCOMPARE(b.conversationSettings(imported), a.conversationSettings(c));
    QCOMPARE(b.conversation(imported).createdAt, a.conversation(c).createdAt);
    const auto ma = a.messages(c), mb = b.messages(imported);
    QCOMPARE(mb.size(), ma.size());
    for (int i = 0; i < ma.size(); i++) {
      QCOMPARE(mb[i].role, ma[i].role);
      QCOMPARE(mb[i].content, ma[i].content);
      QCOMPARE(mb[i].state, ma[i].state);
      QCOMPARE(mb[i].hasStats, ma[i].hasStats);
      QCOMPARE(mb[i].reasoning, ma[i].reasoning);
      QCOMPARE(mb[i].stats.summary(), ma[i].stats.summary());
    }
  }

  void json_has_the_documented_fields() {
    ConversationStore s;
    QVERIFY(s.openInMemory());
    const qint64 c = fillConversation(s);
    const QJsonObject o = QJsonDocument::fromJson(exportConversation(&s, c)).object();
    QCOMPARE(o[QStringLiteral("format")].toString(), QStringLiteral("phaselab.conversation"));
    QCOMPARE(o[QStringLiteral("version")].toInt(), 1);
    QCOMPARE(o[QStringLiteral("mode")].toString(), QStringLiteral("notebook"));
    QCOMPARE(o[QStringLiteral("template")].toString(), QStringLiteral("chatml"));
    QCOMPARE(o[QStringLiteral("system_prompt")].toString(), QStringLiteral("You answer in haiku.\nAlways."));
    QVERIFY(QDateTime::fromString(o[QStringLiteral("created_at")].toString(), Qt::ISODateWithMs).isValid());
    const QJsonArray msgs = o[QStringLiteral("messages")].toArray();
    QCOMPARE(msgs.size(), 5);
    QCOMPARE(msgs[2][QStringLiteral("role")].toString(), QStringLiteral("assistant"));
    QCOMPARE(msgs[2][QStringLiteral("stats")].toObject(), sampleStats().toJson());
    QVERIFY(!msgs[1].toObject().contains(QStringLiteral("stats")));
    QCOMPARE(msgs[2][QStringLiteral("reasoning")].toString(), kReasoning);
    QVERIFY(!msgs[4].toObject().contains(QStringLiteral("reasoning")));  // none: no key
    QCOMPARE(msgs[4][QStringLiteral("state")].toString(), QStringLiteral("stopped"));

    // Defaults: null system prompt and template.
    const qint64 d = s.createConversation(QStringLiteral("plain"));
    const QJsonObject p = QJsonDocument::fromJson(exportConversation(&s, d)).object();
    QCOMPARE(p[QStringLiteral("mode")].toString(), QStringLiteral("chat"));
    QVERIFY(p[QStringLiteral("system_prompt")].isNull());
    QVERIFY(p[QStringLiteral("template")].isNull());
  }

  void export_all_imports_all_in_the_same_order() {
    ConversationStore a;
    QVERIFY(a.open(freshPath()));
    fillConversation(a);
    QTest::qWait(5);
    const qint64 second = a.createConversation(QStringLiteral("second"));
    a.addMessage(second, QStringLiteral("user"), QStringLiteral("newest"));
    const QByteArray all = exportAll(&a);
    QCOMPARE(QJsonDocument::fromJson(all).array().size(), 2);

    ConversationStore b;
    QVERIFY(b.open(freshPath()));
    QString error;
    QList<qint64> ids;
    QVERIFY2(importJson(&b, all, &error, &ids) > 0, qPrintable(error));
    QCOMPARE(ids.size(), 2);
    QStringList titlesA, titlesB;
    for (const auto& c : a.conversations()) titlesA << c.title;
    for (const auto& c : b.conversations()) titlesB << c.title;
    QCOMPARE(titlesB, titlesA);
    QCOMPARE(exportAll(&b), all);
  }

  void import_accepts_a_minimal_file() {
    ConversationStore s;
    QVERIFY(s.openInMemory());
    QString error;
    const qint64 id = importJson(&s, bytes(validObject()), &error);
    QVERIFY2(id > 0, qPrintable(error));
    QCOMPARE(s.conversationSettings(id), ConversationSettings{});
    const auto msgs = s.messages(id);
    QCOMPARE(msgs.size(), 1);
    QCOMPARE(msgs[0].state, QStringLiteral("done"));
    QVERIFY(!msgs[0].hasStats);
    // A message exported mid-answer does not come back as streaming.
    const qint64 id2 = importJson(&s, bytes(withMessageValue(validObject(), QStringLiteral("state"),
                                                              QStringLiteral("streaming"))), &error);
    QVERIFY2(id2 > 0, qPrintable(error));
    QCOMPARE(s.messages(id2)[0].state, QStringLiteral("interrupted"));
  }

  void markdown_holds_every_message() {
    ConversationStore s;
    QVERIFY(s.openInMemory());
    const qint64 c = fillConversation(s);
    const QString md = exportMarkdown(&s, c);
    QVERIFY(md.startsWith(QStringLiteral("# Rust \\*lifetimes\\* & \"quotes\" — ünïcode 🦀\n")));
    QVERIFY(md.contains(QStringLiteral("Mode: notebook")));
    QVERIFY(md.contains(QStringLiteral("Template: chatml")));
    QVERIFY(md.contains(QStringLiteral("## System prompt\n\nYou answer in haiku.\nAlways.\n")));
    for (const MessageRecord& m : s.messages(c)) QVERIFY2(md.contains(m.content), qPrintable(m.content));
    QCOMPARE(md.count(QStringLiteral("## User")), 2);
    QCOMPARE(md.count(QStringLiteral("## Assistant")), 2);
    QCOMPARE(md.count(QStringLiteral("## System\n")), 1);
    QVERIFY(md.contains(QStringLiteral("## Assistant (stopped)")));
    // The stats line, in italics, escaped where it would start markup.
    QString summary = sampleStats().summary();
    QVERIFY(md.contains(QLatin1Char('*') + summary.replace(QLatin1Char('_'), QStringLiteral("\\_")) + QLatin1Char('*')));
    // Code kept as it is; the fence the stopped answer left open is closed.
    QVERIFY(md.contains(QStringLiteral("```rust\nfn f<'a>(x: &'a str) -> &'a str { x }\n```")));
    QVERIFY(md.contains(QStringLiteral("```\nstill code\n```")));
    QCOMPARE(md.count(QStringLiteral("```")) % 2, 0);
    // The reasoning, quoted line by line above its answer: its heading is no
    // heading of the export, its open fence is closed inside the quote.
    QVERIFY2(md.contains(QStringLiteral("## Assistant\n\n> *Reasoning:*\n>\n> # Plan\n> The user wants a borrow.\n>\n"
                                        "> Show it:\n> ```\n> let r\n> ```\n\nHere:")),
             qPrintable(md));
    QVERIFY(!md.contains(QStringLiteral("\n# Plan")));
  }

  void markdown_of_a_default_conversation_is_plain() {
    ConversationRecord r;
    r.title = QStringLiteral("Hi");
    MessageRecord m;
    m.role = QStringLiteral("user");
    m.content = QStringLiteral("hello");
    m.state = QStringLiteral("done");
    QCOMPARE(toMarkdown(r, ConversationSettings{}, {m}), QStringLiteral("# Hi\n\n## User\n\nhello\n"));
  }

  // Each hostile input: a clear error naming the field, nothing written.
  void hostile_json_is_refused_data() {
    QTest::addColumn<QByteArray>("json");
    QTest::addColumn<QString>("field");
    const QJsonObject ok = validObject();
    auto row = [](const char* name, const QByteArray& json, const char* field) {
      QTest::newRow(name) << json << QString::fromUtf8(field);
    };
    row("not json", "this is not json", "not JSON");
    row("truncated", bytes(ok).left(40), "not JSON");
    row("empty", QByteArray(), "not JSON");
    row("a number", "42", "not JSON");
    row("empty array", "[]", "empty list");
    row("array of junk", "[1, 2]", "[0]");
    row("missing format", bytes([&] { auto o = ok; o.remove(QStringLiteral("format")); return o; }()), "format");
    row("other format", bytes(withValue(ok, QStringLiteral("format"), QStringLiteral("chatgpt"))), "format");
    row("newer version", bytes(withValue(ok, QStringLiteral("version"), 2)), "version");
    row("version string", bytes(withValue(ok, QStringLiteral("version"), QStringLiteral("1"))), "version");
    row("version 0.5", bytes(withValue(ok, QStringLiteral("version"), 0.5)), "version");
    row("missing title", bytes([&] { auto o = ok; o.remove(QStringLiteral("title")); return o; }()), "title");
    row("title number", bytes(withValue(ok, QStringLiteral("title"), 5)), "title");
    row("huge title", bytes(withValue(ok, QStringLiteral("title"), QString(5000, QLatin1Char('t')))), "title");
    row("bad date", bytes(withValue(ok, QStringLiteral("created_at"), QStringLiteral("yesterday"))), "created_at");
    row("unknown mode", bytes(withValue(ok, QStringLiteral("mode"), QStringLiteral("rap"))), "mode");
    row("prompt object", bytes(withValue(ok, QStringLiteral("system_prompt"), QJsonObject())), "system_prompt");
    row("unknown template", bytes(withValue(ok, QStringLiteral("template"), QStringLiteral("vicuna"))), "template");
    row("missing messages", bytes([&] { auto o = ok; o.remove(QStringLiteral("messages")); return o; }()), "messages");
    row("messages object", bytes(withValue(ok, QStringLiteral("messages"), QJsonObject())), "messages");
    row("message string", bytes(withValue(ok, QStringLiteral("messages"), QJsonArray{QStringLiteral("hi")})),
        "messages[0]");
    row("unknown role", bytes(withMessageValue(ok, QStringLiteral("role"), QStringLiteral("tool"))), "messages[0].role");
    row("missing role", bytes(withMessageValue(ok, QStringLiteral("role"), QJsonValue::Undefined)), "messages[0].role");
    row("content array", bytes(withMessageValue(ok, QStringLiteral("content"), QJsonArray{1})), "messages[0].content");
    row("content null", bytes(withMessageValue(ok, QStringLiteral("content"), QJsonValue::Null)), "messages[0].content");
    row("missing content", bytes(withMessageValue(ok, QStringLiteral("content"), QJsonValue::Undefined)),
        "messages[0].content");
    row("huge content", bytes(withMessageValue(ok, QStringLiteral("content"), QString((1 << 20) + 1, QLatin1Char('x')))),
        "messages[0].content");
    row("nul in content", bytes(withMessageValue(ok, QStringLiteral("content"), QString(QChar(u'\0')))),
        "messages[0].content");
    row("lone surrogate", R"({"format":"phaselab.conversation","version":1,"title":"t","messages":[{"role":"user","content":"\ud800"}]})",
        "messages[0].content");
    row("reasoning number", bytes(withMessageValue(ok, QStringLiteral("reasoning"), 7)), "messages[0].reasoning");
    row("huge reasoning",
        bytes(withMessageValue(ok, QStringLiteral("reasoning"), QString((1 << 20) + 1, QLatin1Char('r')))),
        "messages[0].reasoning");
    row("nul in reasoning", bytes(withMessageValue(ok, QStringLiteral("reasoning"), QString(QChar(u'\0')))),
        "messages[0].reasoning");
    row("unknown state", bytes(withMessageValue(ok, QStringLiteral("state"), QStringLiteral("weird"))), "messages[0].state");
    row("stats string", bytes(withMessageValue(ok, QStringLiteral("stats"), QStringLiteral("fast"))), "messages[0].stats");
    row("stats negative", bytes(withMessageValue(ok, QStringLiteral("stats"), QJsonObject{{QStringLiteral("n_prompt"), -1}})),
        "messages[0].stats.n_prompt");
    row("stats fraction", bytes(withMessageValue(ok, QStringLiteral("stats"), QJsonObject{{QStringLiteral("n_generated"), 1.5}})),
        "messages[0].stats.n_generated");
    row("stats backend number", bytes(withMessageValue(ok, QStringLiteral("stats"), QJsonObject{{QStringLiteral("backend"), 3}})),
        "messages[0].stats.backend");
    QJsonArray many;
    for (int i = 0; i < conversation_export::kMaxMessages + 1; i++)
      many.append(QJsonObject{{QStringLiteral("role"), QStringLiteral("user")}, {QStringLiteral("content"), QString()}});
    row("too many messages", bytes(withValue(ok, QStringLiteral("messages"), many)), "messages");
    row("huge file", QByteArray(conversation_export::kMaxFileBytes + 1, ' '), "64 MiB");
    // One bad conversation in a list: none of them is written.
    QJsonArray list{ok, ok, withMessageValue(ok, QStringLiteral("role"), QStringLiteral("tool"))};
    row("bad item in a list", QJsonDocument(list).toJson(), "[2].messages[0].role");
  }
  void hostile_json_is_refused() {
    QFETCH(QByteArray, json);
    QFETCH(QString, field);
    ConversationStore s;
    QVERIFY(s.open(freshPath()));
    const qint64 existing = s.createConversation(QStringLiteral("existing"));
    s.addMessage(existing, QStringLiteral("user"), QStringLiteral("keep me"));
    const int before = countRows(s);
    QString error;
    QList<qint64> ids{-1};
    QCOMPARE(importJson(&s, json, &error, &ids), qint64(0));
    QVERIFY(!error.isEmpty());
    QVERIFY2(error.contains(field), qPrintable(error));
    QCOMPARE(ids, QList<qint64>{-1});
    QCOMPARE(countRows(s), before);
    QCOMPARE(s.conversations().size(), 1);
  }

  // A failure while writing rolls back the conversations already inserted.
  void import_is_all_or_nothing_when_writing_fails() {
    ConversationStore s;
    QVERIFY(s.openInMemory());
    QList<ConversationStore::ConversationData> items(2);
    items[0].record.title = QStringLiteral("first");
    items[1].record.title = QStringLiteral("second");
    MessageRecord bad;
    bad.role = QStringLiteral("user");
    bad.content = QStringLiteral("x");
    items[1].messages = {bad};
    items[1].settings.mode = QStringLiteral("nonsense");  // refused before any write
    QVERIFY(!s.insertConversations(items));
    QVERIFY(s.lastError().contains(QLatin1String("mode")));
    QCOMPARE(s.conversations().size(), 0);

    // A message the database refuses after the first conversation went in.
    items[1].settings = {};
    items[1].messages[0].role = QString();  // binds as NULL, violating NOT NULL
    QVERIFY(!s.insertConversations(items));
    QCOMPARE(s.conversations().size(), 0);
  }

  // ---- appearance ----

  void dark_theme_has_dark_window_and_light_text() {
    applyTheme(Theme::Dark);
    const QPalette p = QApplication::palette();
    QVERIFY2(p.color(QPalette::Window).lightness() < 80, qPrintable(p.color(QPalette::Window).name()));
    QVERIFY(p.color(QPalette::WindowText).lightness() > 180);
    QVERIFY(p.color(QPalette::Text).lightness() > 180);
    QVERIFY(p.color(QPalette::Base).lightness() < 80);
    QVERIFY(p.color(QPalette::Base) != p.color(QPalette::AlternateBase));
    QVERIFY(Appearance::isDark(p));
    QCOMPARE(QApplication::style()->name().toLower(), QStringLiteral("fusion"));
    QCOMPARE(Appearance::instance()->theme(), Theme::Dark);
    QCOMPARE(QSettings().value(QStringLiteral("appearance/theme")).toString(), QStringLiteral("dark"));
  }

  void light_theme_has_light_window_and_dark_text() {
    applyTheme(Theme::Light);
    const QPalette p = QApplication::palette();
    QVERIFY(p.color(QPalette::Window).lightness() > 200);
    QVERIFY(p.color(QPalette::Text).lightness() < 60);
    QVERIFY(!Appearance::isDark(p));
    QCOMPARE(QSettings().value(QStringLiteral("appearance/theme")).toString(), QStringLiteral("light"));
  }

  void system_theme_restores_the_startup_look() {
    applyTheme(Theme::Dark);
    QVERIFY(QApplication::palette().color(QPalette::Window) != m_startupPalette.color(QPalette::Window));
    applyTheme(Theme::System);
    QCOMPARE(QApplication::style()->name(), m_startupStyle);
    for (QPalette::ColorRole role : {QPalette::Window, QPalette::WindowText, QPalette::Base, QPalette::Text,
                                     QPalette::Button, QPalette::Highlight})
      QCOMPARE(QApplication::palette().color(role), m_startupPalette.color(role));
    QCOMPARE(Appearance::instance()->theme(), Theme::System);
    QCOMPARE(QSettings().value(QStringLiteral("appearance/theme")).toString(), QStringLiteral("system"));
  }

  void changed_is_emitted_on_each_change() {
    QSignalSpy spy(Appearance::instance(), &Appearance::changed);
    applyTheme(Theme::Dark);
    increaseFontSize();
    resetFontSize();
    applyTheme(Theme::System);
    QCOMPARE(spy.size(), 4);
  }

  void font_size_steps_and_clamps() {
    resetFontSize();
    const int base = Appearance::instance()->defaultPointSize();
    QCOMPARE(Appearance::instance()->fontPointSize(), base);
    increaseFontSize();
    QCOMPARE(QApplication::font().pointSize(), base + 1);
    QCOMPARE(QSettings().value(QStringLiteral("appearance/fontPointSize")).toInt(), base + 1);
    decreaseFontSize();
    decreaseFontSize();
    QCOMPARE(QApplication::font().pointSize(), base - 1);
    for (int i = 0; i < 100; i++) increaseFontSize();
    QCOMPARE(QApplication::font().pointSize(), Appearance::kMaxPointSize);
    for (int i = 0; i < 100; i++) decreaseFontSize();
    QCOMPARE(QApplication::font().pointSize(), Appearance::kMinPointSize);
    applyFontPointSize(1000);
    QCOMPARE(QApplication::font().pointSize(), Appearance::kMaxPointSize);
    QCOMPARE(QSettings().value(QStringLiteral("appearance/fontPointSize")).toInt(), Appearance::kMaxPointSize);
    resetFontSize();
    QCOMPARE(QApplication::font().pointSize(), base);
    QVERIFY(!QSettings().contains(QStringLiteral("appearance/fontPointSize")));
  }

  void saved_appearance_is_applied_at_startup() {
    applyTheme(Theme::System);
    resetFontSize();
    const QColor systemWindow = m_startupPalette.color(QPalette::Window);
    {
      QSettings s;
      s.setValue(QStringLiteral("appearance/theme"), QStringLiteral("dark"));
      s.setValue(QStringLiteral("appearance/fontPointSize"), 15);
    }
    loadAppearance();
    QCOMPARE(Appearance::instance()->theme(), Theme::Dark);
    QVERIFY(QApplication::palette().color(QPalette::Window).lightness() < 80);
    QCOMPARE(QApplication::font().pointSize(), 15);

    // Nonsense in the file: the system look and size, nothing refused.
    applyTheme(Theme::System);
    resetFontSize();
    QSettings().setValue(QStringLiteral("appearance/theme"), QStringLiteral("purple"));
    QSettings().setValue(QStringLiteral("appearance/fontPointSize"), QStringLiteral("huge"));
    loadAppearance();
    QCOMPARE(Appearance::instance()->theme(), Theme::System);
    QCOMPARE(QApplication::palette().color(QPalette::Window), systemWindow);
    QCOMPARE(QApplication::font().pointSize(), Appearance::instance()->defaultPointSize());
    // A saved size out of range is clamped.
    QSettings().setValue(QStringLiteral("appearance/fontPointSize"), 500);
    loadAppearance();
    QCOMPARE(QApplication::font().pointSize(), Appearance::kMaxPointSize);
    resetFontSize();
  }
};

QTEST_MAIN(TestGuiExport)
#include "test_gui_export.moc"
