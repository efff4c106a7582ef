// MetricsDock: live charts of the running request and the turns before it.
#pragma once

#include <QDockWidget>

#include "engine_types.h"
#include "hardware_probe.h"

class QLabel;
class QProgressBar;
class QChartView;
class QLineSeries;
class QValueAxis;
class QBarSet;
class QBarCategoryAxis;
class QHorizontalStackedBarSeries;

namespace phaselab::ui {

class PhaseMeter;

class MetricsDock : public QDockWidget {
  Q_OBJECT
 public:
  static constexpr int kTimelineRequests = 8;  // requests kept in the timeline

  explicit MetricsDock(QWidget* parent = nullptr);

  void setModel(const ModelInfo& info);
  void setPeaks(const HardwarePeaks& peaks);
  void updateMetrics(const LiveMetrics& m);

  // For tests.
  int decodePointCount() const;
  int ttftPointCount() const;
  int timelineCount() const;
  QString kvText() const;
  PhaseMeter* phaseMeter() const { return m_phaseMeter; }
  QString specText() const;  // for tests

 private:
  void startRequest(const LiveMetrics& m);

  int m_requestId = 0;
  int m_turn = 0;
  double m_maxTps = 1, m_maxTtft = 1, m_maxTimeline = 1;
  QString m_modelText;
  QLabel* m_header = nullptr;
  QLineSeries* m_decodeSeries = nullptr;
  QValueAxis* m_decodeX = nullptr;
  QValueAxis* m_decodeY = nullptr;
  QLineSeries* m_ttftSeries = nullptr;
  QValueAxis* m_ttftX = nullptr;
  QValueAxis* m_ttftY = nullptr;
  QHorizontalStackedBarSeries* m_timeline = nullptr;
  QBarSet* m_prefillSet = nullptr;
  QBarSet* m_decodeSet = nullptr;
  QBarCategoryAxis* m_timelineCategories = nullptr;
  QValueAxis* m_timelineX = nullptr;
  QProgressBar* m_kvBar = nullptr;
  QLabel* m_kvBlocks = nullptr;
  QLabel* m_spec = nullptr;
  PhaseMeter* m_phaseMeter = nullptr;
};

}  // namespace phaselab::ui
