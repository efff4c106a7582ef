#include "conversation_settings_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QLabel>
#include <QPlainTextEdit>

namespace phaselab::ui {

ConversationSettingsDialog::ConversationSettingsDialog(const ConversationSettings& current,
                                                       const QString& modelTemplate,
                                                       const QString& appDefaultPrompt, QWidget* parent)
    : QDialog(parent) {
  setWindowTitle(tr("Conversation Settings"));
  setObjectName(QStringLiteral("conversationSettingsDialog"));
  auto* form = new QFormLayout(this);

  m_mode = new QComboBox;
  m_mode->setObjectName(QStringLiteral("conversationMode"));
  m_mode->setAccessibleName(tr("Mode"));
  m_mode->addItem(tr("Chat: questions and answers through a chat template"), QStringLiteral("chat"));
  m_mode->addItem(tr("Notebook: the model continues your text"), QStringLiteral("notebook"));
  m_mode->setCurrentIndex(std::max(0, m_mode->findData(current.mode)));
  form->addRow(tr("Mode:"), m_mode);

  m_ownPrompt = new QCheckBox(tr("Use a system prompt of its own"));
  m_ownPrompt->setObjectName(QStringLiteral("ownSystemPrompt"));
  m_ownPrompt->setChecked(current.hasSystemPrompt);
  m_prompt = new QPlainTextEdit;
  m_prompt->setObjectName(QStringLiteral("conversationSystemPrompt"));
  m_prompt->setAccessibleName(tr("System prompt"));
  m_prompt->setPlainText(current.hasSystemPrompt ? current.systemPrompt : appDefaultPrompt);
  m_prompt->setEnabled(current.hasSystemPrompt);
  m_prompt->setPlaceholderText(tr("e.g. You are a concise assistant."));
  m_prompt->setMaximumHeight(90);
  connect(m_ownPrompt, &QCheckBox::toggled, m_prompt, &QWidget::setEnabled);
  form->addRow(m_ownPrompt);
  form->addRow(tr("System prompt:"), m_prompt);

  m_template = new QComboBox;
  m_template->setObjectName(QStringLiteral("conversationTemplate"));
  m_template->setAccessibleName(tr("Chat template"));
  m_template->addItem(modelTemplate.isEmpty() ? tr("The model's own")
                                              : tr("The model's own (%1)").arg(modelTemplate),
                      QString());
  for (const QString& name : ConversationSettings::templateNames()) m_template->addItem(name, name);
  m_template->setCurrentIndex(std::max(0, m_template->findData(current.chatTemplate)));
  m_template->setToolTip(tr("plain-fewshot: a User:/Assistant: transcript after three example exchanges, what "
                            "base models without a template answer best. The others are the formats of "
                            "instruction-tuned families."));
  form->addRow(tr("Chat template:"), m_template);
  auto* note = new QLabel(tr("Notebook mode uses neither: the text goes to the model as written."));
  note->setWordWrap(true);
  note->setForegroundRole(QPalette::PlaceholderText);
  form->addRow(note);

  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  form->addRow(buttons);
}

ConversationSettings ConversationSettingsDialog::settings() const {
  ConversationSettings s;
  s.mode = m_mode->currentData().toString();
  s.hasSystemPrompt = m_ownPrompt->isChecked();
  s.systemPrompt = s.hasSystemPrompt ? m_prompt->toPlainText().trimmed() : QString();
  s.chatTemplate = m_template->currentData().toString();
  return s;
}

}  // namespace phaselab::ui
