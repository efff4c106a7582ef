// ConversationSettingsDialog: the open conversation's mode (chat or
// notebook), its own system prompt, and the chat template it uses.
#pragma once

#include <QDialog>

#include "conversation_store.h"

class QCheckBox;
class QComboBox;
class QPlainTextEdit;

namespace phaselab::ui {

class ConversationSettingsDialog : public QDialog {
  Q_OBJECT
 public:
  // modelTemplate: the family the loaded model uses by itself (empty when no
  // model is loaded); appDefaultPrompt: Settings' system prompt.
  ConversationSettingsDialog(const ConversationSettings& current, const QString& modelTemplate,
                             const QString& appDefaultPrompt, QWidget* parent = nullptr);
  ConversationSettings settings() const;

 private:
  QComboBox* m_mode = nullptr;
  QCheckBox* m_ownPrompt = nullptr;
  QPlainTextEdit* m_prompt = nullptr;
  QComboBox* m_template = nullptr;
};

}  // namespace phaselab::ui
