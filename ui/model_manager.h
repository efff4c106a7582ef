// ModelManager: the models in the model folder with their metadata, plus
// Open (file dialog), Load and Unload. Metadata is read off the GUI thread.
#pragma once

#include <QDialog>

#include "engine_types.h"

class QTableWidget;
class QLabel;
class QPushButton;

namespace phaselab::ui {

class ModelManager : public QDialog {
  Q_OBJECT
 public:
  ModelManager(const QString& modelDir, const ModelInfo& loaded, bool hasModel, QWidget* parent = nullptr);

  // Reads a model's metadata (maps the file; nothing is computed). On failure
  // the returned info has an empty architecture and error set.
  static ModelInfo describe(const QString& path, QString* error);
  static QString formatParams(qint64 n);
  // "7.48 B" or, for a mixture of experts, "7.48 B, 0.74 B active".
  static QString formatParamsWithActive(const ModelInfo& m);
  static QString formatBytes(qint64 n);

 signals:
  void loadRequested(const QString& path);
  void unloadRequested();

 private:
  void scan();
  void setRows(const QList<ModelInfo>& rows, const QStringList& errors);
  QString selectedPath() const;

  QString m_modelDir;
  QTableWidget* m_table = nullptr;
  QLabel* m_status = nullptr;
  QPushButton* m_load = nullptr;
};

}  // namespace phaselab::ui
