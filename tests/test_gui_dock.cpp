// The metrics dock describes what it says it describes (issue 31): the KV
// panel the pool of the model loaded now and a request run without the
// cache as such, the speculative panel the setting restored at start, the
// charts the open conversation only. The keyboard only moves the focus when
// it tabs into the conversation list, the focused transcript shows a frame,
// and charts and banners take their colours from the theme by one path.
#include <QAbstractButton>
#include <QApplication>
#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QLineEdit>
#include <QListWidget>
#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <QToolButton>
#include <QLabel>
#include <QTextBrowser>
#include <QValueAxis>

#include "app_settings.h"
#include "appearance.h"
#include "banner.h"
#include "chat_session.h"
#include "chat_view.h"
#include "conversation_list.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "message_widget.h"
#include "metrics_dock.h"

using namespace phaselab::ui;

namespace {

// One finished request as the engine worker reports it: a prefill snapshot,
// one decode snapshot, done.
void feedRequest(MetricsDock& dock, int id, double ttftMs, int tokens, bool kvCache = true) {
  LiveMetrics m;
  m.requestId = id;
  m.phase = Phase::prefill;
  m.nPrompt = 30;
  m.kvCapacity = 512;
  m.kvUsed = 0;
  m.kvCache = kvCache;
  dock.updateMetrics(m);
  m.phase = Phase::decode;
  m.ttftMs = ttftMs;
  m.nGenerated = tokens / 2;
  m.elapsedMs = ttftMs + 10.0 * m.nGenerated;
  m.windowTps = m.decodeTps = 100;
  m.kvUsed = kvCache ? 30 + m.nGenerated : 0;
  dock.updateMetrics(m);
  m.phase = Phase::done;
  m.nGenerated = tokens;
  m.elapsedMs = ttftMs + 10.0 * tokens;
  m.kvUsed = kvCache ? 30 + tokens : 0;
  m.nReused = kvCache ? 12 : 0;
  if (kvCache) {
    m.kvBlocksUsed = 3;
    m.kvBlocksCached = 2;
    m.kvBlocksTotal = 33;
  }
  dock.updateMetrics(m);
}

ModelInfo localModel(int context, int blocks) {
  ModelInfo info;
  info.name = QStringLiteral("tiny");
  info.backend = QStringLiteral("cpu-avx2");
  info.threads = 1;
  info.contextSize = context;
  info.kvBlocks = blocks;
  info.kvType = QStringLiteral("f16");
  info.kvBytes = 1 << 20;
  info.weightBytes = 1 << 20;
  info.hasChatTemplate = true;
  return info;
}

MessageRecord answerRecord(double ttftMs, double decodeMs, int tokens) {
  MessageRecord r;
  r.role = QStringLiteral("assistant");
  r.state = QStringLiteral("done");
  r.hasStats = true;
  r.stats.ttftMs = ttftMs;
  r.stats.decodeMs = decodeMs;
  r.stats.nGenerated = tokens;
  return r;
}

// Every grid pen of the dock's charts, in chart order.
QList<QPen> gridPens(MetricsDock& dock) {
  QList<QPen> pens;
  for (QChartView* v : dock.findChildren<QChartView*>())
    for (QAbstractAxis* a : v->chart()->axes()) pens << a->gridLinePen();
  return pens;
}

}  // namespace

class TestGuiDock : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;

  MainWindow::Options options() {
    return testing::windowOptions(m_dir.filePath(QStringLiteral("d%1.sqlite").arg(++m_n)));
  }
  static GenerationSettings answer(int n, bool kv = true) {
    GenerationSettings g;
    g.temperature = 0;
    g.maxTokens = n;
    g.ignoreEos = true;
    g.useKvCache = kv;
    return g;
  }
  static bool loadStories(MainWindow& w, int context) {
    QSignalSpy ready(&w, &MainWindow::modelReady);
    EngineConfig c;
    c.threads = 1;
    c.contextSize = context;
    w.setEngineConfig(c);
    w.loadModel(testing::stories());
    // A base model: notebook mode, so that a prompt is its few words (chat
    // would add three example exchanges, longer than a small context).
    w.setConversationMode(QStringLiteral("notebook"));
    return ready.wait(20000);
  }
  static void sendAndWait(MainWindow& w, const QString& text) {
    QSignalSpy finished(w.chatSession(), &ChatSession::answerFinished);
    QVERIFY(w.sendMessage(text));
    QVERIFY(finished.wait(60000));
    QApplication::processEvents();
  }

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_dock"); }
  void cleanup() { applyTheme(Theme::System); }

  // Item 4: a reload shows the new pool's capacity with nothing used, in
  // either direction (a small context after a large one and back).
  void kv_panel_shows_the_new_pool_after_a_reload() {
    MetricsDock dock;
    dock.setModel(localModel(10, 2));
    QCOMPARE(dock.kvText(), QStringLiteral("0 / 10 (0%)"));
    LiveMetrics m;
    m.requestId = 1;
    m.phase = Phase::done;
    m.kvUsed = 8;
    m.kvCapacity = 10;
    m.kvBlocksUsed = 1;
    m.kvBlocksTotal = 2;
    dock.updateMetrics(m);
    QCOMPARE(dock.kvText(), QStringLiteral("8 / 10 (80%)"));
    dock.setModel(localModel(4096, 257));
    QCOMPARE(dock.kvText(), QStringLiteral("0 / 4096 (0%)"));
    QVERIFY2(dock.kvBlocksText().contains(QStringLiteral("0 of 257 blocks")), qPrintable(dock.kvBlocksText()));
    m.requestId = 2;
    m.kvUsed = 173;
    m.kvCapacity = 4096;
    dock.updateMetrics(m);
    dock.setModel(localModel(10, 2));
    QCOMPARE(dock.kvText(), QStringLiteral("0 / 10 (0%)"));
    QVERIFY2(dock.kvBlocksText().contains(QStringLiteral("0 of 2 blocks")), qPrintable(dock.kvBlocksText()));
  }

  // Item 4: a request without the KV cache shows no blocks and no reuse,
  // not the previous request's; the next one with the cache shows its own.
  void kv_panel_says_the_cache_is_off_for_the_request() {
    MetricsDock dock;
    dock.setModel(localModel(512, 33));
    feedRequest(dock, 1, 50, 20);
    QVERIFY2(dock.kvBlocksText().contains(QStringLiteral("12 prompt tokens reused")), qPrintable(dock.kvBlocksText()));
    feedRequest(dock, 2, 50, 20, false);
    QCOMPARE(dock.kvText(), QStringLiteral("off for this request"));
    QVERIFY2(dock.kvBlocksText().contains(QStringLiteral("off for this request")) &&
                 !dock.kvBlocksText().contains(QStringLiteral("reused;")) &&
                 !dock.kvBlocksText().contains(QStringLiteral("3 of 33")),
             qPrintable(dock.kvBlocksText()));
    feedRequest(dock, 3, 50, 20);
    QVERIFY2(dock.kvText().startsWith(QStringLiteral("50 / 512 (")), qPrintable(dock.kvText()));
    QVERIFY2(dock.kvBlocksText().contains(QStringLiteral("3 of 33 blocks")), qPrintable(dock.kvBlocksText()));
  }

  // Item 4 end to end: the real engine, a request with the cache, a reload
  // at another context, a request without the cache.
  void kv_panel_after_reload_and_without_cache_in_the_window() {
    MainWindow w(options());
    w.show();
    QVERIFY(loadStories(w, 64));
    w.setGenerationSettings(answer(6));
    sendAndWait(w, QStringLiteral("Once"));
    const QString used = w.metricsDock()->kvText();
    QVERIFY2(used.contains(QStringLiteral(" / 64 (")) && !used.startsWith(QStringLiteral("0 /")), qPrintable(used));
    QVERIFY(loadStories(w, 128));
    QCOMPARE(w.metricsDock()->kvText(), QStringLiteral("0 / 128 (0%)"));
    w.setGenerationSettings(answer(6, false));
    sendAndWait(w, QStringLiteral("Once upon"));
    QCOMPARE(w.metricsDock()->kvText(), QStringLiteral("off for this request"));
    QVERIFY2(!w.metricsDock()->kvBlocksText().contains(QStringLiteral("reused;")),
             qPrintable(w.metricsDock()->kvBlocksText()));
  }

  // Item 6: after a restart the panel says what the toolbar shows, and it
  // follows the toolbar from there.
  void speculative_panel_follows_the_restored_setting() {
    AppSettings saved = AppSettings::load();
    saved.generation.speculative = QStringLiteral("lookup");
    saved.save();
    {
      MainWindow w(options());
      auto* combo = w.findChild<QComboBox*>(QStringLiteral("specCombo"));
      QVERIFY(combo);
      QCOMPARE(combo->currentData().toString(), QStringLiteral("lookup"));
      const QString text = w.metricsDock()->specText();
      QVERIFY2(text.contains(QStringLiteral("Prompt lookup is selected")) &&
                   text.contains(QStringLiteral("no request has measured it yet")),
               qPrintable(text));
      combo->setCurrentIndex(combo->findData(QStringLiteral("none")));
      QVERIFY2(w.metricsDock()->specText().contains(QStringLiteral("is off")), qPrintable(w.metricsDock()->specText()));
    }
    saved.generation.speculative = QStringLiteral("none");
    saved.save();
  }

  // Item 11: New Chat clears the charts and numbers the turns from 1; an
  // opened conversation shows its own stored answers.
  void charts_belong_to_the_open_conversation() {
    MainWindow w(options());
    w.show();
    QVERIFY(loadStories(w, 128));
    w.setGenerationSettings(answer(4));
    sendAndWait(w, QStringLiteral("one"));
    sendAndWait(w, QStringLiteral("two"));
    const qint64 first = w.chatSession()->conversationId();
    MetricsDock* dock = w.metricsDock();
    QCOMPARE(dock->ttftPointCount(), 2);
    QCOMPARE(dock->timelineLabels(), (QStringList{"#1", "#2"}));
    // New Chat as a user presses it.
    QPushButton* newChat = nullptr;
    for (QPushButton* b : w.conversationList()->findChildren<QPushButton*>())
      if (b->text() == QLatin1String("New chat")) newChat = b;
    QVERIFY(newChat);
    newChat->click();
    QCOMPARE(w.chatSession()->conversationId(), 0);
    QCOMPARE(dock->ttftPointCount(), 0);
    QCOMPARE(dock->timelineCount(), 0);
    QCOMPARE(dock->decodePointCount(), 0);
    sendAndWait(w, QStringLiteral("three"));
    QCOMPARE(dock->ttftPointCount(), 1);
    QCOMPARE(dock->ttftPoints().first().x(), 1.0);
    QCOMPARE(dock->timelineLabels(), QStringList{"#1"});
    // Back to the first: its two answers, from the store.
    w.chatSession()->openConversation(first);
    QCOMPARE(dock->ttftPointCount(), 2);
    QCOMPARE(dock->timelineLabels(), (QStringList{"#1", "#2"}));
    const QList<MessageRecord> stored = w.store()->messages(first);
    QCOMPARE(dock->ttftPoints().last(), QPointF(2, stored.last().stats.ttftMs));
  }

  // Item 11 in the dock: a conversation's stored stats refill the TTFT
  // chart and the timeline; its failed answers count as turns without a point.
  void opened_conversation_refills_ttft_and_timeline() {
    MetricsDock dock;
    dock.setModel(localModel(512, 33));
    feedRequest(dock, 1, 50, 20);
    feedRequest(dock, 2, 60, 20);
    MessageRecord user;
    user.role = QStringLiteral("user");
    MessageRecord failed = answerRecord(0, 0, 0);
    failed.stats.error = QStringLiteral("boom");
    dock.showConversation(7, {user, answerRecord(120, 300, 30), user, failed, user, answerRecord(90, 200, 20)});
    QCOMPARE(dock.ttftPoints(), (QList<QPointF>{{1, 120}, {3, 90}}));
    QCOMPARE(dock.timelineLabels(), (QStringList{"#1", "#3"}));
    QCOMPARE(dock.decodePointCount(), 0);
    feedRequest(dock, 3, 70, 20);
    QCOMPARE(dock.ttftPoints().last(), QPointF(4, 70));
    dock.showConversation(7, {});  // the same one again (a relabel): unchanged
    QCOMPARE(dock.ttftPointCount(), 3);
    dock.showConversation(0, {});
    QCOMPARE(dock.ttftPointCount(), 0);
    QVERIFY(dock.placeholders().size() == 3);
  }

  // Item 11: a request still running when another conversation opens stays
  // out of the new conversation's charts.
  void a_stopped_request_stays_out_of_the_next_conversation() {
    MetricsDock dock;
    dock.setModel(localModel(512, 33));
    LiveMetrics m;
    m.requestId = 4;
    m.phase = Phase::decode;
    m.ttftMs = 40;
    m.nGenerated = 5;
    m.elapsedMs = 90;
    m.windowTps = 100;
    dock.updateMetrics(m);
    dock.showConversation(0, {});
    m.phase = Phase::done;
    dock.updateMetrics(m);  // its last snapshot, after the switch
    QCOMPARE(dock.ttftPointCount(), 0);
    QCOMPARE(dock.timelineCount(), 0);
    feedRequest(dock, 5, 50, 10);
    QCOMPARE(dock.ttftPoints(), (QList<QPointF>{{1, 50}}));
  }

  // Item 13: Tab into the list moves the focus and opens nothing; Enter
  // opens the conversation the focus is on.
  void tab_into_the_list_only_moves_the_focus() {
    MainWindow w(options());
    const qint64 a = w.store()->createConversation(QStringLiteral("alpha"));
    const qint64 b = w.store()->createConversation(QStringLiteral("beta"));
    w.store()->addMessage(a, QStringLiteral("user"), QStringLiteral("hello"));
    w.store()->addMessage(b, QStringLiteral("user"), QStringLiteral("hi"));
    w.conversationList()->refresh();
    QCOMPARE(w.conversationList()->count(), 2);
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowActive(&w));
    QCOMPARE(w.chatSession()->conversationId(), 0);
    QLineEdit* search = w.conversationList()->searchField();
    search->setFocus(Qt::TabFocusReason);
    QTRY_COMPARE(QApplication::focusWidget(), search);
    QTest::keyClick(search, Qt::Key_Tab);
    auto* list = w.conversationList()->findChild<QListWidget*>(QStringLiteral("conversationList"));
    QTRY_COMPARE(QApplication::focusWidget(), list);
    QApplication::processEvents();
    QCOMPARE(w.chatSession()->conversationId(), 0);
    QTest::keyClick(list, Qt::Key_Return);
    QVERIFY(w.chatSession()->conversationId() != 0);
  }

  // Item 13: the transcript takes the focus by Tab (its keys scroll it) and
  // then shows a frame.
  void focused_transcript_shows_a_frame() {
    MainWindow w(options());
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowActive(&w));
    ChatView* view = w.chatView();
    QVERIFY(view->focusPolicy() & Qt::TabFocus);
    QVERIFY(!view->isFocusFrameShown());
    view->setFocus(Qt::TabFocusReason);
    QTRY_VERIFY(view->hasFocus());
    QVERIFY(view->isFocusFrameShown());
    w.conversationList()->searchField()->setFocus(Qt::TabFocusReason);
    QTRY_VERIFY(!view->hasFocus());
    QVERIFY(!view->isFocusFrameShown());
  }

  // Item 14: a chart made in a dark window has the grid of one switched to
  // dark later (one path styles both), and the grid differs from the light one.
  void chart_grid_is_the_same_however_the_theme_came() {
    applyTheme(Theme::Dark);
    MetricsDock bornDark;
    const QList<QPen> dark = gridPens(bornDark);
    QCOMPARE(dark.size(), 6);  // two axes per chart
    applyTheme(Theme::Light);
    MetricsDock switched;
    const QList<QPen> light = gridPens(switched);
    applyTheme(Theme::Dark);
    const QList<QPen> switchedDark = gridPens(switched);
    for (int i = 0; i < dark.size(); i++) {
      QCOMPARE(switchedDark[i].color(), dark[i].color());
      QCOMPARE(switchedDark[i].widthF(), dark[i].widthF());
      QVERIFY(light[i].color() != dark[i].color());
      // A guide, not a line as bright as the text: well below the text's
      // lightness on the dark background.
      QVERIFY2(dark[i].color().lightness() < 110, qPrintable(dark[i].color().name()));
    }
  }

  // Item 14: a banner is tinted from the theme's window colour: light in the
  // light theme, dark in the dark one, with the theme's text colour; the
  // same whether the theme came before or after it.
  void banner_follows_the_theme() {
    applyTheme(Theme::Light);
    Banner lightBorn(QColor(40, 120, 240));
    const QColor light = lightBorn.palette().color(QPalette::Window);
    applyTheme(Theme::Dark);
    Banner darkBorn(QColor(40, 120, 240));
    const QColor dark = darkBorn.palette().color(QPalette::Window);
    QVERIFY2(light.lightness() > 150 && dark.lightness() < 110,
             qPrintable(light.name() + QLatin1Char(' ') + dark.name()));
    QCOMPARE(lightBorn.palette().color(QPalette::Window), dark);  // switched live: the same
    QVERIFY(darkBorn.palette().color(QPalette::WindowText).lightness() > 150);
    // The window's base model note too.
    MainWindow w(options());
    auto* note = w.findChild<Banner*>(QStringLiteral("baseModelNote"));
    QVERIFY(note);
    QCOMPARE(note->palette().color(QPalette::Window), dark);
    applyTheme(Theme::Light);
    QCOMPARE(note->palette().color(QPalette::Window), light);
  }

  // A harmony model's reasoning (gpt-oss) shows dimmed above the answer as
  // it streams and stays out of the message's text (what is saved, copied
  // and sent back to the model); a card without reasoning shows no line.
  void reasoning_shows_above_the_answer_and_stays_out_of_it() {
    MessageRecord m;
    m.role = QStringLiteral("assistant");
    m.state = QStringLiteral("streaming");
    MessageWidget card(m);
    card.resize(500, 300);
    card.show();
    auto* line = card.findChild<QLabel*>(QStringLiteral("messageReasoning"));
    QVERIFY(line);
    QVERIFY(!line->isVisible());
    card.appendReasoning(QStringLiteral(" The user"));
    card.appendReasoning(QStringLiteral(" greets me."));
    card.appendText(QStringLiteral("Hello!"));
    QVERIFY(line->isVisible());
    QCOMPARE(card.reasoning(), QStringLiteral("The user greets me."));
    QVERIFY2(line->text().contains(QStringLiteral("The user greets me.")), qPrintable(line->text()));
    QCOMPARE(card.text(), QStringLiteral("Hello!"));
    auto* toggle = card.findChild<QToolButton*>(QStringLiteral("messageReasoningToggle"));
    QVERIFY(toggle && toggle->isVisible());
    QVERIFY(card.isReasoningOpen());

    // Done: the reasoning closes to its toggle, which says how long it is
    // and opens it again.
    MessageRecord done = m;
    done.content = QStringLiteral("Hello!");
    done.state = QStringLiteral("done");
    card.finish(done);
    QCOMPARE(card.reasoning(), QStringLiteral("The user greets me."));  // kept from the stream
    QVERIFY(!card.isReasoningOpen());
    QVERIFY(!line->isVisible());
    QVERIFY(toggle->isVisible());
    QVERIFY2(toggle->text().contains(QLatin1String("4 words")), qPrintable(toggle->text()));
    toggle->click();
    QVERIFY(card.isReasoningOpen());
    QVERIFY(line->isVisible());
    QVERIFY2(line->text().contains(QStringLiteral("The user greets me.")), qPrintable(line->text()));
    toggle->click();
    QVERIFY(!line->isVisible());

    // Opened by the person while it streams: the end leaves it open.
    MessageWidget watched(m);
    watched.show();
    watched.appendReasoning(QStringLiteral("Thinking."));
    auto* t2 = watched.findChild<QToolButton*>(QStringLiteral("messageReasoningToggle"));
    t2->click();  // closes
    t2->click();  // opens again
    watched.finish(done);
    QVERIFY(watched.isReasoningOpen());

    // A card without reasoning has neither line nor toggle.
    MessageWidget plain(done);
    plain.show();
    QVERIFY(!plain.findChild<QToolButton*>(QStringLiteral("messageReasoningToggle"))->isVisible());
    QVERIFY(!plain.findChild<QLabel*>(QStringLiteral("messageReasoning"))->isVisible());
  }

  // Item 14: a card shown while the theme switches to dark paints its text
  // in the dark theme's text colour (its body kept black text on the dark
  // card: the body's style sheet had fixed its palette at creation).
  void message_text_follows_a_live_theme_switch() {
    applyTheme(Theme::Light);
    MessageRecord m;
    m.role = QStringLiteral("assistant");
    m.content = QStringLiteral("Some **answer** text");
    m.state = QStringLiteral("done");
    MessageWidget card(m);
    card.show();
    auto* body = card.findChild<QTextBrowser*>(QStringLiteral("messageBody"));
    QVERIFY(body);
    QVERIFY(body->palette().color(QPalette::Text).lightness() < 110);
    applyTheme(Theme::Dark);
    QVERIFY2(body->palette().color(QPalette::Text).lightness() > 150,
             qPrintable(body->palette().color(QPalette::Text).name()));
    QVERIFY(body->viewport()->palette().color(QPalette::Text).lightness() > 150);
    applyTheme(Theme::Light);
    QVERIFY(body->palette().color(QPalette::Text).lightness() < 110);
  }
};

QTEST_MAIN(TestGuiDock)
#include "test_gui_dock.moc"
