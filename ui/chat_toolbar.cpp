#include "chat_toolbar.h"

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QToolButton>
#include <algorithm>

#include "phaselab/speculative.h"

namespace phaselab::ui {

// A row of plain widgets rather than a QToolBar: a toolbar hides what does
// not fit behind an overflow button, and these must stay in sight.
ChatToolbar::ChatToolbar(QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("chatToolbar"));
  auto* row = new QHBoxLayout(this);
  row->setContentsMargins(2, 0, 2, 0);
  row->setSpacing(6);

  m_modeCombo = new QComboBox;
  m_modeCombo->setObjectName(QStringLiteral("modeCombo"));
  m_modeCombo->setAccessibleName(tr("Conversation mode"));
  m_modeCombo->addItem(tr("Chat"), QStringLiteral("chat"));
  m_modeCombo->addItem(tr("Notebook"), QStringLiteral("notebook"));
  m_modeCombo->setToolTip(tr("Chat: questions and answers through the chat template.\nNotebook: the model continues "
                             "your text as written, the way to use a base model."));
  row->addWidget(m_modeCombo);
  connect(m_modeCombo, &QComboBox::currentIndexChanged, this,
          [this] { emit modeChosen(m_modeCombo->currentData().toString()); });

  m_kvToggle = new QCheckBox(tr("KV cache"));
  m_kvToggle->setObjectName(QStringLiteral("kvToggle"));
  m_kvToggle->setAccessibleName(tr("KV cache"));
  row->addWidget(m_kvToggle);
  connect(m_kvToggle, &QCheckBox::toggled, this, &ChatToolbar::kvCacheToggled);

  m_specLabel = new QLabel(tr("Speculative:"));
  row->addWidget(m_specLabel);
  m_specCombo = new QComboBox;
  m_specCombo->setObjectName(QStringLiteral("specCombo"));
  m_specCombo->setAccessibleName(tr("Speculative decoding"));
  m_specLabel->setBuddy(m_specCombo);
  m_specCombo->addItem(tr("off"), QString::fromLatin1(to_string(SpeculativeMode::off)));
  m_specCombo->addItem(tr("prompt lookup"), QString::fromLatin1(to_string(SpeculativeMode::prompt_lookup)));
  m_specCombo->addItem(tr("draft model"), QString::fromLatin1(to_string(SpeculativeMode::draft_model)));
  m_specCombo->addItem(tr("self (layers skipped)"), QString::fromLatin1(to_string(SpeculativeMode::self_draft)));
  row->addWidget(m_specCombo);
  connect(m_specCombo, &QComboBox::currentIndexChanged, this,
          [this] { emit speculativeChosen(m_specCombo->currentData().toString()); });

  auto* conv = new QToolButton;
  conv->setObjectName(QStringLiteral("conversationSettingsButton"));
  conv->setText(tr("Settings…"));
  conv->setToolTip(tr("This conversation's mode, system prompt and chat template (Ctrl+Shift+S)"));
  conv->setAccessibleName(tr("Conversation settings"));
  row->addWidget(conv);
  connect(conv, &QToolButton::clicked, this, &ChatToolbar::conversationSettingsRequested);
  row->addStretch(1);
}

void ChatToolbar::showGeneration(const GenerationSettings& g, bool remote) {
  const QSignalBlocker a(m_kvToggle), b(m_specCombo);
  m_kvToggle->setChecked(g.useKvCache);
  m_specCombo->setCurrentIndex(std::max(0, m_specCombo->findData(g.speculative)));
  // These apply to a local model only (they are not sent to a server).
  for (QWidget* w : {static_cast<QWidget*>(m_kvToggle), static_cast<QWidget*>(m_specLabel),
                     static_cast<QWidget*>(m_specCombo)})
    w->setEnabled(!remote);
  const QString remoteTip = tr("The remote server runs its own KV cache and decoding: this applies to a local model.");
  m_kvToggle->setToolTip(remote ? remoteTip
                                : tr("Off: every token recomputes the whole conversation. Watch decode tokens/s drop."));
  m_specCombo->setToolTip(remote ? remoteTip
                                 : tr("Draft tokens cheaply, verify them in one pass of the model. The answer is the "
                                      "same (greedy) or has the same distribution (sampling); the metrics dock shows "
                                      "acceptance."));
}

void ChatToolbar::showMode(const QString& mode) {
  const QSignalBlocker block(m_modeCombo);
  m_modeCombo->setCurrentIndex(std::max(0, m_modeCombo->findData(mode)));
}

}  // namespace phaselab::ui
