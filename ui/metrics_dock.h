// MetricsDock: live charts of the running request and the turns before it.
// Two tabs, so that each fits a 1280x800 window without scrolling: the
// charts, and the phase meter with the KV cache and speculative decoding.
#pragma once

#include <QDockWidget>
#include <QList>

#include "engine_types.h"
#include "hardware_probe.h"

class QLabel;
class QProgressBar;
class QChart;
class QChartView;
class QLineSeries;
class QValueAxis;
class QBarSet;
class QBarCategoryAxis;
class QHorizontalStackedBarSeries;
class QGraphicsSimpleTextItem;
class QTabWidget;

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

  // Brings the phase meter's tab to the front.
  void showPhaseMeter();

  // For tests.
  int decodePointCount() const;
  int ttftPointCount() const;
  QList<QPointF> ttftPoints() const;
  int timelineCount() const;
  QStringList timelineLabels() const;
  QStringList placeholders() const;  // the "No answers yet" texts shown now
  QString kvText() const;
  PhaseMeter* phaseMeter() const { return m_phaseMeter; }
  QTabWidget* tabs() const { return m_tabs; }
  QString specText() const;
  // The line that says a remote server's figures are client-side only.
  bool isRemoteNoteShown() const;
  QString remoteNoteText() const;

 signals:
  void remeasureRequested();  // the phase meter's "Measure again"

 private:
  // One row of the timeline, kept for its tooltip.
  struct TimelineRow {
    int number = 0;  // "#12"
    double prefillMs = 0, decodeMs = 0;
    int tokens = 0;
  };

  // The constructor's sections.
  QWidget* buildCharts();
  QChartView* buildDecodeChart();
  QChartView* buildTtftChart();
  QChartView* buildTimelineChart();
  void connectCharts();
  void buildMeterPage();

  void startRequest(const LiveMetrics& m);
  void refreshTimeline();
  QList<int> tickBudgets() const;  // most ticks per axis at the charts' size now
  void rescale();
  void showPointToolTip(QLineSeries* series, const QPointF& hovered, bool state);
  void showTimelineToolTip(bool state, int index);

  int m_requestId = 0;
  int m_requests = 0;  // requests seen: the timeline's and the TTFT chart's numbering
  int m_ttftRequestId = 0;  // the request whose TTFT is plotted last
  double m_maxTps = 0, m_maxTtft = 0;
  int m_maxTurn = 0, m_maxTokens = 0;
  QList<TimelineRow> m_rows;
  QString m_modelText;
  QString m_kvStorage;  // "F16 storage, 28.7 MiB (15 of 18 layers keep only their 512-position window)"
  QLabel* m_header = nullptr;
  QLabel* m_remoteNote = nullptr;
  bool m_remote = false;
  QTabWidget* m_tabs = nullptr;
  QWidget* m_meterPage = nullptr;
  QList<int> m_budgets;
  bool m_rescalePending = false;
  QChart* m_decodeChart = nullptr;
  QChart* m_ttftChart = nullptr;
  QChart* m_timelineChart = nullptr;
  QLineSeries* m_decodeSeries = nullptr;
  QValueAxis* m_decodeX = nullptr;
  QValueAxis* m_decodeY = nullptr;
  QGraphicsSimpleTextItem* m_decodeEmpty = nullptr;
  QLineSeries* m_ttftSeries = nullptr;
  QValueAxis* m_ttftX = nullptr;
  QValueAxis* m_ttftY = nullptr;
  QGraphicsSimpleTextItem* m_ttftEmpty = nullptr;
  QHorizontalStackedBarSeries* m_timeline = nullptr;
  QBarSet* m_prefillSet = nullptr;
  QBarSet* m_decodeSet = nullptr;
  QBarCategoryAxis* m_timelineCategories = nullptr;
  QValueAxis* m_timelineX = nullptr;
  QGraphicsSimpleTextItem* m_timelineEmpty = nullptr;
  QProgressBar* m_kvBar = nullptr;
  QLabel* m_kvBlocks = nullptr;
  QLabel* m_spec = nullptr;
  PhaseMeter* m_phaseMeter = nullptr;
};

}  // namespace phaselab::ui
