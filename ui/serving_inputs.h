// The Serving lab's inputs: the model, the workload (chat streams, the long
// prompts, how they arrive, for how long), the policies to run one after
// another and goodput's targets, read into a ServingRequest and back.
#pragma once

#include <QWidget>

#include "serving_process.h"

class QCheckBox;
class QDoubleSpinBox;
class QLineEdit;
class QSpinBox;

namespace phaselab::ui {

class ServingInputs : public QWidget {
  Q_OBJECT
 public:
  explicit ServingInputs(QWidget* parent = nullptr);

  ServingRequest request() const;
  // Policies it cannot show (not one of the three kinds) are left out, and
  // unchecked kinds stay unchecked.
  void setRequest(const ServingRequest& r);
  void setModel(const QString& path);
  QString model() const;
  // Empty when the inputs can run; else what to change.
  QString validate() const;

 private:
  void chooseModel();

  QLineEdit* m_model = nullptr;
  QSpinBox* m_threads = nullptr;
  QSpinBox* m_streams = nullptr;
  QSpinBox* m_longPrompt = nullptr;
  QSpinBox* m_longCount = nullptr;
  QDoubleSpinBox* m_longRate = nullptr;
  QDoubleSpinBox* m_duration = nullptr;
  QSpinBox* m_ttft = nullptr;
  QSpinBox* m_itl = nullptr;
  QCheckBox* m_prefillFirst = nullptr;
  QCheckBox* m_chunked = nullptr;
  QSpinBox* m_chunk = nullptr;
  QCheckBox* m_chunkedAuto = nullptr;
  QCheckBox* m_disaggregated = nullptr;
  QSpinBox* m_prefillCores = nullptr;
  QSpinBox* m_decodeCores = nullptr;
  QCheckBox* m_baseline = nullptr;
};

}  // namespace phaselab::ui
