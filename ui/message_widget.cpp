#include "message_widget.h"

#include "appearance.h"

#include <QAbstractTextDocumentLayout>
#include <QApplication>
#include <QClipboard>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QLabel>
#include <QRegularExpression>
#include <QTextBlock>
#include <QTextBrowser>
#include <QTextCursor>
#include <QToolButton>
#include <QVBoxLayout>

namespace phaselab::ui {

MessageWidget::MessageWidget(const MessageRecord& message, QWidget* parent) : QFrame(parent), m_message(message) {
  const bool isUser = message.role == QLatin1String("user");
  setObjectName(isUser ? QStringLiteral("userMessage") : QStringLiteral("assistantMessage"));
  setFrameShape(QFrame::StyledPanel);
  setAutoFillBackground(true);

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(10, 6, 10, 6);
  layout->setSpacing(2);
  m_role = new QLabel(isUser ? tr("You") : message.role == QLatin1String("system") ? tr("System") : tr("Assistant"));
  QFont bold = m_role->font();
  bold.setBold(true);
  m_role->setFont(bold);
  layout->addWidget(m_role);

  // A reasoning model's reasoning: a toggle (open while the answer streams,
  // closed once it is done and on a saved answer) over the text itself.
  m_reasoningToggle = new QToolButton;
  m_reasoningToggle->setObjectName(QStringLiteral("messageReasoningToggle"));
  m_reasoningToggle->setAutoRaise(true);
  m_reasoningToggle->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
  m_reasoningToggle->setCheckable(true);
  m_reasoningToggle->hide();
  connect(m_reasoningToggle, &QToolButton::clicked, this, [this](bool open) {
    m_reasoningChosen = true;
    setReasoningOpen(open);
  });
  layout->addWidget(m_reasoningToggle, 0, Qt::AlignLeft);

  m_reasoning = new QLabel;
  m_reasoning->setObjectName(QStringLiteral("messageReasoning"));
  m_reasoning->setWordWrap(true);
  m_reasoning->setMinimumWidth(0);
  m_reasoning->setTextFormat(Qt::PlainText);
  m_reasoning->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_reasoning->setForegroundRole(QPalette::PlaceholderText);
  m_reasoning->setAccessibleName(tr("The model's reasoning"));
  m_reasoning->hide();
  layout->addWidget(m_reasoning);
  setReasoningOpen(message.state == QLatin1String("streaming"));  // shows a saved answer's reasoning

  m_body = new QTextBrowser;
  m_body->setObjectName(QStringLiteral("messageBody"));
  m_body->setFrameShape(QFrame::NoFrame);
  m_body->setOpenExternalLinks(true);
  m_body->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  m_body->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  m_body->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
  m_body->setMinimumWidth(0);
  m_body->setAccessibleName(tr("Message text"));
  m_body->viewport()->setAutoFillBackground(false);
  m_body->setStyleSheet(QStringLiteral("QTextBrowser { background: transparent; }"));
  connect(m_body->document()->documentLayout(), &QAbstractTextDocumentLayout::documentSizeChanged, this,
          &MessageWidget::fitHeight);
  layout->addWidget(m_body);

  auto* footer = new QHBoxLayout;
  m_stats = new QLabel;
  m_stats->setObjectName(QStringLiteral("messageStats"));
  m_stats->setForegroundRole(QPalette::PlaceholderText);
  m_stats->setTextInteractionFlags(Qt::TextSelectableByMouse);
  // A long stats line wraps instead of setting the card's minimum width: a
  // card wider than the chat would hide its buttons off the right edge.
  m_stats->setWordWrap(true);
  m_stats->setMinimumWidth(0);
  footer->addWidget(m_stats, 1);
  auto makeButton = [&](const QString& text, const QString& tip) {
    auto* b = new QToolButton;
    b->setText(text);
    b->setToolTip(tip);
    b->setAutoRaise(true);
    b->setAccessibleName(tip);
    footer->addWidget(b);
    return b;
  };
  m_copy = makeButton(tr("Copy"), tr("Copy the message as Markdown"));
  connect(m_copy, &QToolButton::clicked, this, [this] { QApplication::clipboard()->setText(m_message.content); });
  if (isUser) {
    m_edit = makeButton(tr("Edit"), tr("Edit this message and send it again (later messages are replaced)"));
    connect(m_edit, &QToolButton::clicked, this, [this] { emit editRequested(m_message.id); });
  } else {
    m_regenerate = makeButton(tr("Regenerate"), tr("Replace this answer with a new one"));
    connect(m_regenerate, &QToolButton::clicked, this, [this] { emit regenerateRequested(m_message.id); });
  }
  layout->addLayout(footer);

  m_renderTimer.setSingleShot(true);
  m_renderTimer.setInterval(kRenderIntervalMs);
  connect(&m_renderTimer, &QTimer::timeout, this, &MessageWidget::render);
  applyAppearance();
  // The theme and text size can change while the card is shown.
  connect(Appearance::instance(), &Appearance::changed, this, [this] {
    applyAppearance();
    render();
  });
  render();
  updateFooter();
}

void MessageWidget::applyAppearance() {
  // Colours and sizes come from the application's current palette and font,
  // not the ones the card was made with.
  const bool isUser = m_message.role == QLatin1String("user");
  QPalette pal = QApplication::palette();
  pal.setColor(QPalette::Window, isUser ? pal.color(QPalette::AlternateBase) : pal.color(QPalette::Base));
  setPalette(pal);
  // The body's style sheet (a transparent background) fixed its palette when
  // it was polished: set it again, or a card shown across a switch to dark
  // keeps black text on the dark card.
  m_body->setPalette(pal);
  m_body->viewport()->setPalette(pal);
  m_body->setStyleSheet(m_body->styleSheet());
  QFont small = QApplication::font();
  small.setPointSizeF(small.pointSizeF() * 0.9);
  m_stats->setFont(small);
  QFont bold = QApplication::font();
  bold.setBold(true);
  m_role->setFont(bold);
  QFont italic = QApplication::font();
  italic.setItalic(true);
  m_reasoning->setFont(italic);
  // The toggle's label dimmed like the text it opens (a tool button draws
  // its label in ButtonText).
  QPalette dim = pal;
  dim.setColor(QPalette::ButtonText, pal.color(QPalette::PlaceholderText));
  m_reasoningToggle->setPalette(dim);
  m_body->setFont(QApplication::font());
}

QString MessageWidget::statsText() const { return m_stats->text(); }

void MessageWidget::appendReasoning(const QString& delta) {
  if (m_message.reasoning.isEmpty()) {
    QString d = delta;
    while (!d.isEmpty() && d.front().isSpace()) d.remove(0, 1);
    if (d.isEmpty()) return;
    m_message.reasoning = d;
  } else {
    m_message.reasoning += delta;
  }
  showReasoning();
}

void MessageWidget::showReasoning() {
  const bool has = !m_message.reasoning.isEmpty();
  m_reasoningToggle->setVisible(has);
  m_reasoning->setVisible(has && m_reasoningOpen);
  if (!has) return;
  if (m_message.state == QLatin1String("streaming")) {
    m_reasoningToggle->setText(tr("Reasoning…"));
  } else {
    static const QRegularExpression space(QStringLiteral("\\s+"));
    const auto words = m_message.reasoning.split(space, Qt::SkipEmptyParts).size();
    m_reasoningToggle->setText(words == 1 ? tr("Reasoning (1 word)") : tr("Reasoning (%1 words)").arg(words));
  }
  if (m_reasoningOpen) m_reasoning->setText(m_message.reasoning);
}

bool MessageWidget::isReasoningOpen() const { return m_reasoningOpen; }

void MessageWidget::setReasoningOpen(bool open) {
  m_reasoningOpen = open;
  m_reasoningToggle->setChecked(open);
  m_reasoningToggle->setArrowType(open ? Qt::DownArrow : Qt::RightArrow);
  m_reasoningToggle->setToolTip(open ? tr("Hide the model's reasoning") : tr("Show the model's reasoning"));
  m_reasoningToggle->setAccessibleName(m_reasoningToggle->toolTip());
  showReasoning();
}

void MessageWidget::appendText(const QString& delta) {
  m_message.content += delta;
  if (!m_renderTimer.isActive()) m_renderTimer.start();
}

void MessageWidget::setText(const QString& text) {
  m_message.content = text;
  render();
}

void MessageWidget::finish(const MessageRecord& message) {
  const QString streamed = m_message.reasoning;
  m_message = message;
  if (m_message.reasoning.isEmpty()) m_message.reasoning = streamed;
  // The answer is what is left to read: its reasoning closes, unless the
  // person opened or closed it themselves meanwhile.
  if (!m_reasoningChosen) setReasoningOpen(false);
  showReasoning();
  m_renderTimer.stop();
  render();
  updateFooter();
}

void MessageWidget::setRoleLabel(const QString& label) { m_role->setText(label); }

void MessageWidget::setRegenerateEnabled(bool enabled) {
  if (m_regenerate) m_regenerate->setEnabled(enabled);
  if (m_edit) m_edit->setEnabled(enabled);
}

void MessageWidget::render() {
  QTextDocument* doc = m_body->document();
  if (m_message.role == QLatin1String("user")) {
    doc->setPlainText(m_message.content);  // the user's text is shown as typed
  } else if (m_message.content.isEmpty() && m_message.state == QLatin1String("streaming")) {
    doc->setPlainText(QStringLiteral("…"));
  } else {
    doc->setMarkdown(m_message.content);
    // Qt's Markdown import marks code blocks but gives them no background:
    // shade them and use the fixed font so code stays readable in both themes.
    const QFont fixed = QFontDatabase::systemFont(QFontDatabase::FixedFont);
    const QColor shade = palette().color(QPalette::AlternateBase);
    for (QTextBlock b = doc->begin(); b.isValid(); b = b.next()) {
      QTextBlockFormat f = b.blockFormat();
      if (!f.hasProperty(QTextFormat::BlockCodeFence) && !f.hasProperty(QTextFormat::BlockCodeLanguage)) continue;
      QTextCursor c(b);
      f.setBackground(shade);
      c.setBlockFormat(f);
      c.select(QTextCursor::BlockUnderCursor);
      QTextCharFormat cf;
      cf.setFont(fixed);
      c.mergeCharFormat(cf);
    }
  }
  fitHeight();
}

void MessageWidget::fitHeight() {
  const int h = static_cast<int>(m_body->document()->size().height()) + 4;
  if (m_body->height() != h) m_body->setFixedHeight(h);
}

void MessageWidget::resizeEvent(QResizeEvent* e) {
  QFrame::resizeEvent(e);
  fitHeight();
}

void MessageWidget::updateFooter() {
  QString s;
  if (m_message.role == QLatin1String("assistant")) {
    if (m_message.hasStats) s = m_message.stats.summary();
    if (m_message.state == QLatin1String("interrupted")) s = tr("interrupted (the app closed while answering)");
    else if (m_message.state == QLatin1String("streaming")) s = tr("answering…");
  }
  m_stats->setText(s);
}

}  // namespace phaselab::ui
