// MetricsDock: live charts of the running request and the open
// conversation's turns before it. Two tabs, so that each fits a 1280x800
// window without scrolling: the charts, and the phase meter with the KV
// cache and speculative decoding. Every panel is cleared or refreshed when
// what it describes changes: the charts with the conversation, the KV panel
// with the model (its pool) and with a request run without the cache, the
// speculative panel with the setting.
#pragma once

#include <QDockWidget>
#include <QList>

#include "conversation_store.h"
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

  // A model (re)loaded: the KV panel shows its new pool, empty.
  void setModel(const ModelInfo& info);
  void setPeaks(const HardwarePeaks& peaks);
  void updateMetrics(const LiveMetrics& m);
  // The speculative mode the next request runs with (GenerationSettings::
  // speculative): until a request measures it, the panel says it is
  // selected and not measured yet.
  void setSpeculativeMode(const QString& mode);
  // The conversation now open (0: a new one) and its messages. The charts
  // describe one conversation: they are cleared, turns count from 1 again,
  // and the stored answers' stats refill the TTFT chart and the timeline.
  // Opening the conversation already shown changes nothing.
  void showConversation(qint64 id, const QList<MessageRecord>& messages);

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
  QString kvBlocksText() const;
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

  void restyleCharts();  // colours and fonts from the application's palette and font
  void startRequest(const LiveMetrics& m);
  void updateCharts(const LiveMetrics& m);
  void updateKvPanel(const LiveMetrics& m);
  void updateSpecPanel(const LiveMetrics& m);
  void showKvPoolEmpty();
  void showSpeculativeSelected();
  void clearCharts();
  void setTimelineCategories();
  void refreshTimeline();
  QList<int> tickBudgets() const;  // most ticks per axis at the charts' size now
  void rescale();
  void showPointToolTip(QLineSeries* series, const QPointF& hovered, bool state);
  void showTimelineToolTip(bool state, int index);

  int m_requestId = 0;
  int m_requests = 0;  // requests seen: the timeline's and the TTFT chart's numbering
  int m_ttftRequestId = 0;  // the request whose TTFT is plotted last
  // A request of the conversation shown before: its remaining snapshots
  // stay out of the charts.
  int m_otherConversationRequest = 0;
  qint64 m_conversationId = -1;  // the conversation the charts describe (-1: none yet)
  double m_maxTps = 0, m_maxTtft = 0;
  int m_maxTurn = 0, m_maxTokens = 0;
  QList<TimelineRow> m_rows;
  QString m_modelText;
  QString m_kvStorage;  // "F16 storage, 28.7 MiB (15 of 18 layers keep only their 512-position window)"
  int m_contextSize = 0, m_kvPoolBlocks = 0;  // of the model loaded now
  QString m_specMode;  // the setting: none | lookup | draft
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
