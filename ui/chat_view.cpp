#include "chat_view.h"

#include <QPainter>
#include <QResizeEvent>
#include <QScrollBar>
#include <QToolButton>
#include <QVBoxLayout>

#include "message_widget.h"

namespace phaselab::ui {

namespace {
// Within this many pixels of the bottom counts as "at the bottom": a wheel
// step is ~60 px, so one notch up is a deliberate move away.
constexpr int kBottomSlackPx = 24;

// The focused view's frame, drawn over its edges (the viewport and the
// scroll bar fill the rest, and no style draws a focus frame around a
// scroll area). It reads the palette when it paints, so it follows the theme.
class FocusFrame : public QWidget {
 public:
  explicit FocusFrame(QWidget* parent) : QWidget(parent) {
    setAttribute(Qt::WA_TransparentForMouseEvents);
    setFocusPolicy(Qt::NoFocus);
    hide();
  }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    QPen pen(palette().color(QPalette::Highlight), 2);
    pen.setJoinStyle(Qt::MiterJoin);
    p.setPen(pen);
    p.drawRect(QRectF(rect()).adjusted(1, 1, -1, -1));
  }
};

}  // namespace

ChatView::ChatView(QWidget* parent) : QScrollArea(parent) {
  setObjectName(QStringLiteral("chatView"));
  setAccessibleName(tr("Conversation"));
  setWidgetResizable(true);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  // The scroll bar is always there, so the cards' width does not change (and
  // their text does not reflow) when a conversation first outgrows the view.
  setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOn);
  m_content = new QWidget;
  m_layout = new QVBoxLayout(m_content);
  m_layout->setContentsMargins(8, 8, 8, 8);
  m_layout->setSpacing(8);
  m_layout->addStretch(1);
  setWidget(m_content);

  m_jump = new QToolButton(this);
  m_jump->setObjectName(QStringLiteral("jumpToLatest"));
  m_jump->setText(tr("↓ Jump to latest"));
  m_jump->setToolTip(tr("Scroll to the newest message and follow the answer"));
  m_jump->setAccessibleName(tr("Jump to latest message"));
  m_jump->setToolButtonStyle(Qt::ToolButtonTextOnly);
  m_jump->hide();
  connect(m_jump, &QToolButton::clicked, this, &ChatView::jumpToLatest);
  m_focusFrame = new FocusFrame(this);

  connect(verticalScrollBar(), &QScrollBar::valueChanged, this, &ChatView::onScrolled);
  connect(verticalScrollBar(), &QScrollBar::rangeChanged, this, &ChatView::onRangeChanged);
}

QList<MessageWidget*> ChatView::messageWidgets() const { return m_content->findChildren<MessageWidget*>(); }

MessageWidget* ChatView::messageWidget(qint64 id) const {
  for (MessageWidget* w : messageWidgets())
    if (w->messageId() == id) return w;
  return nullptr;
}

void ChatView::setRoleLabels(const QString& user, const QString& assistant) {
  m_userLabel = user;
  m_assistantLabel = assistant;
}

MessageWidget* ChatView::makeCard(const MessageRecord& message) {
  auto* w = new MessageWidget(message, m_content);
  if (message.role == QLatin1String("user") && !m_userLabel.isEmpty()) w->setRoleLabel(m_userLabel);
  if (message.role == QLatin1String("assistant") && !m_assistantLabel.isEmpty()) w->setRoleLabel(m_assistantLabel);
  w->setRegenerateEnabled(!m_busy);
  connect(w, &MessageWidget::regenerateRequested, this, &ChatView::regenerateRequested);
  connect(w, &MessageWidget::editRequested, this, &ChatView::editRequested);
  m_layout->insertWidget(m_layout->count() - 1, w);  // before the stretch
  return w;
}

void ChatView::setMessages(const QList<MessageRecord>& messages) {
  for (MessageWidget* w : messageWidgets()) {
    m_layout->removeWidget(w);
    delete w;
  }
  for (const MessageRecord& m : messages) makeCard(m);
  jumpToLatest();  // an opened conversation shows its end
}

void ChatView::addMessage(const MessageRecord& message) {
  makeCard(message);
  // The person's own message (and the answer that follows it) is what they
  // want to see: sending always returns to the bottom.
  if (message.role == QLatin1String("user")) jumpToLatest();
}

void ChatView::removeMessage(qint64 id) {
  if (MessageWidget* w = messageWidget(id)) {
    m_layout->removeWidget(w);
    delete w;
  }
}

void ChatView::appendToMessage(qint64 id, const QString& delta) {
  // Growth of the card changes the scroll range; onRangeChanged follows it.
  if (MessageWidget* w = messageWidget(id)) w->appendText(delta);
}

void ChatView::appendReasoning(qint64 id, const QString& delta) {
  if (MessageWidget* w = messageWidget(id)) w->appendReasoning(delta);
}

void ChatView::finishMessage(qint64 id, const MessageRecord& message) {
  if (MessageWidget* w = messageWidget(id)) w->finish(message);
}

void ChatView::editMessage(qint64 id, const QString& content) {
  if (MessageWidget* w = messageWidget(id)) w->setText(content);
}

void ChatView::setBusy(bool busy) {
  m_busy = busy;
  for (MessageWidget* w : messageWidgets()) w->setRegenerateEnabled(!busy);
}

bool ChatView::isJumpButtonShown() const { return m_jump->isVisibleTo(this); }

bool ChatView::isFocusFrameShown() const { return m_focusFrame->isVisibleTo(this); }

void ChatView::focusInEvent(QFocusEvent* e) {
  QScrollArea::focusInEvent(e);
  m_focusFrame->setGeometry(rect());
  m_focusFrame->raise();
  m_focusFrame->show();
}

void ChatView::focusOutEvent(QFocusEvent* e) {
  QScrollArea::focusOutEvent(e);
  m_focusFrame->hide();
}

void ChatView::jumpToLatest() {
  m_follow = true;
  m_jump->hide();
  // The layout may not have run yet for cards added just now: do it, so the
  // range below is the final one (onRangeChanged keeps up with later growth).
  m_content->layout()->activate();
  verticalScrollBar()->setValue(verticalScrollBar()->maximum());
}

void ChatView::onRangeChanged(int, int max) {
  if (m_follow) verticalScrollBar()->setValue(max);
}

void ChatView::onScrolled(int value) {
  const QScrollBar* sb = verticalScrollBar();
  m_follow = value >= sb->maximum() - kBottomSlackPx;
  m_jump->setVisible(!m_follow);
  if (!m_follow) placeJumpButton();
}

void ChatView::placeJumpButton() {
  m_jump->adjustSize();
  const QRect vp = viewport()->geometry();  // in this widget's coordinates
  m_jump->move(vp.center().x() - m_jump->width() / 2, vp.bottom() - m_jump->height() - 8);
  m_jump->raise();
}

void ChatView::resizeEvent(QResizeEvent* e) {
  QScrollArea::resizeEvent(e);
  m_focusFrame->setGeometry(rect());
  placeJumpButton();
  if (m_follow) verticalScrollBar()->setValue(verticalScrollBar()->maximum());
}

}  // namespace phaselab::ui
