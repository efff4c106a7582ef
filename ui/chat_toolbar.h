// ChatToolbar: the row above the chat. The conversation's mode (chat or
// notebook), the KV cache and speculative decoding toggles, which change
// the generation settings for the next message without a reload (watch the
// metrics move), and the conversation's settings.
#pragma once

#include <QWidget>

#include "engine_types.h"

class QCheckBox;
class QComboBox;
class QLabel;

namespace phaselab::ui {

class ChatToolbar : public QWidget {
  Q_OBJECT
 public:
  explicit ChatToolbar(QWidget* parent = nullptr);

  // Shows g's KV cache and speculative mode without emitting. remote: the
  // model is a remote server's, which keeps its own KV cache and decides how
  // it decodes, so both toggles are greyed.
  void showGeneration(const GenerationSettings& g, bool remote);
  // Shows the mode ("chat" or "notebook") without emitting.
  void showMode(const QString& mode);

 signals:
  void modeChosen(const QString& mode);
  void kvCacheToggled(bool on);
  void speculativeChosen(const QString& mode);  // "none", "lookup" or "draft"
  void conversationSettingsRequested();

 private:
  QComboBox* m_modeCombo = nullptr;
  QCheckBox* m_kvToggle = nullptr;
  QLabel* m_specLabel = nullptr;
  QComboBox* m_specCombo = nullptr;
};

}  // namespace phaselab::ui
