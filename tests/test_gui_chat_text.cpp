// The text of a chat as a person reads it: answers start at their first
// visible character, Continue with an empty box continues a notebook (and
// says what to do otherwise), and names stay on one line.
#include <QLabel>
#include <QPushButton>
#include <QSignalSpy>
#include <QStatusBar>
#include <QTemporaryDir>
#include <QTest>

#include "chat_session.h"
#include "chat_view.h"
#include "engine_controller.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "message_widget.h"

using namespace phaselab::ui;

class TestGuiChatText : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;

  MainWindow::Options options() {
    return testing::windowOptions(m_dir.filePath(QStringLiteral("w%1.sqlite").arg(++m_n)));
  }
  static GenerationSettings greedy(int n) {
    GenerationSettings g;
    g.temperature = 0;
    g.maxTokens = n;
    g.ignoreEos = true;
    return g;
  }
  static QString lastAnswer(MainWindow& w) { return w.chatSession()->messages().last().content; }

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_chat_text"); }

  // stories260K is a SentencePiece model: its answers' first token is a
  // word-start space (" Once"), which a chat card showed.
  void chat_answers_start_at_their_first_visible_character() {
    MainWindow w(options());
    w.show();
    QVERIFY(testing::loadStories(w));
    w.setGenerationSettings(greedy(12));
    QSignalSpy finished(w.chatSession(), &ChatSession::answerFinished);
    QVERIFY(w.sendMessage(QStringLiteral("Tell me a story")));
    QVERIFY(finished.wait(60000));
    const QString answer = lastAnswer(w);
    QVERIFY(!answer.isEmpty());
    QVERIFY2(!answer.front().isSpace(), qPrintable(QLatin1Char('[') + answer + QLatin1Char(']')));
    QCOMPARE(w.store()->messages(w.chatSession()->conversationId()).last().content, answer);
  }

  void continue_with_an_empty_box_continues_the_notebook() {
    MainWindow w(options());
    w.show();
    QVERIFY(testing::loadStories(w));
    w.setConversationMode(QStringLiteral("notebook"));
    w.setGenerationSettings(greedy(8));
    // Nothing written yet: the window says what to do.
    QVERIFY(!w.sendMessage(QString()));
    QVERIFY2(w.statusBar()->currentMessage().contains(QStringLiteral("Write the start")),
             qPrintable(w.statusBar()->currentMessage()));
    QSignalSpy finished(w.chatSession(), &ChatSession::answerFinished);
    QVERIFY(w.sendMessage(QStringLiteral("Once upon a time")));
    QVERIFY(finished.wait(60000));
    const int before = w.chatSession()->messages().size();
    const QString first = lastAnswer(w);
    // The box is empty now: Continue goes on from where the text ends.
    auto* send = w.findChild<QPushButton*>(QStringLiteral("sendButton"));
    QVERIFY(send);
    QCOMPARE(send->text(), QStringLiteral("Continue"));
    send->click();
    QVERIFY(finished.wait(60000));
    QCOMPARE(w.chatSession()->messages().size(), before + 1);
    QCOMPARE(w.chatSession()->messages().last().role, QStringLiteral("assistant"));
    QVERIFY(!lastAnswer(w).isEmpty());
    QCOMPARE(w.chatSession()->messages()[before - 1].content, first);  // the earlier text is untouched
  }

  void an_empty_chat_message_says_what_to_do() {
    MainWindow w(options());
    w.show();
    QVERIFY(testing::loadStories(w));
    QVERIFY(!w.sendMessage(QStringLiteral("   ")));
    QVERIFY2(w.statusBar()->currentMessage().contains(QStringLiteral("Type a message")),
             qPrintable(w.statusBar()->currentMessage()));
    QVERIFY(w.chatSession()->messages().isEmpty());
  }

  void backend_names_do_not_break_at_their_hyphens() {
    RequestStats s;
    s.backend = QStringLiteral("cpu-avx512-vnni");
    const QString summary = s.summary();
    QVERIFY(!summary.contains(QStringLiteral("cpu-avx512")));
    QVERIFY(summary.contains(QStringLiteral("cpu\u2011avx512\u2011vnni")));
  }
};

QTEST_MAIN(TestGuiChatText)
#include "test_gui_chat_text.moc"
