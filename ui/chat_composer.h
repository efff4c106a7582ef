// ChatComposer: the message editor with Send and Stop.
#pragma once

#include <QWidget>

class QPlainTextEdit;
class QPushButton;

namespace phaselab::ui {

class ChatComposer : public QWidget {
  Q_OBJECT
 public:
  explicit ChatComposer(QWidget* parent = nullptr);

  QString text() const;
  void setText(const QString& text);
  void clear();
  void setBusy(bool busy);
  void focusEditor();
  // Notebook: the model continues the text ("Continue"); chat: "Send".
  void setNotebookMode(bool notebook);
  QPlainTextEdit* editor() const { return m_editor; }

 signals:
  void sendRequested(const QString& text);
  void stopRequested();

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  QPlainTextEdit* m_editor = nullptr;
  QPushButton* m_send = nullptr;
  QPushButton* m_stop = nullptr;
};

}  // namespace phaselab::ui
