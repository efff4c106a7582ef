// StatusBarLabels: the status bar's permanent labels, left to right: "Not
// saved" while the conversations live in memory only, the API server's
// address while it serves, and the model (name · backend · type mix, or
// what is loading). While the bar shows a message, the model label gives up
// the width the message needs (its text elided, whole in its tooltip): at
// 800x600 the permanent labels had left a message two letters.
#pragma once

#include <QObject>
#include <QString>

class QLabel;
class QStatusBar;
class QWidget;

namespace phaselab::ui {

class StatusBarLabels : public QObject {
  Q_OBJECT
 public:
  // Adds the labels to window's status bar; notSaved: show "Not saved".
  StatusBarLabels(QStatusBar* bar, QWidget* window, bool notSaved);

  // The model label's whole text (it shows less while a message needs the room).
  void setModelText(const QString& text);
  QString modelText() const { return m_modelText; }
  void setNotSaved(bool notSaved);
  bool isNotSavedShown() const;
  // "Serving at http://127.0.0.1:PORT/v1"; hideServing() clears it.
  void showServing(const QString& text);
  void hideServing();
  QString servingText() const;  // empty when not shown
  // Shares the bar's width out again (after a message, a resize, a new text).
  void fit();

 private:
  QStatusBar* m_bar;
  QWidget* m_window;
  QLabel* m_notSaved = nullptr;
  QLabel* m_serve = nullptr;
  QLabel* m_model = nullptr;
  QString m_modelText;
};

}  // namespace phaselab::ui
