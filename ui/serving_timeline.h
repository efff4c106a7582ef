// The Serving lab's timeline: one lane per chat stream and per long request,
// each generated token a tick at its time, the long request's prefill
// (arrival -> first token) a band. Under prefill-first the band lines up
// with a gap in every chat lane: the stall. The lanes and their pixel
// geometry are computed by plain functions (timelineModel, layoutTimeline),
// so tests check the stall's layout without reading pixels; the widget only
// paints what layoutTimeline returns.
#pragma once

#include <QRectF>

class QPainter;
#include <QString>
#include <QWidget>
#include <utility>
#include <vector>

#include "serving_result.h"

namespace phaselab::ui {

struct TimelineLane {
  QString label;  // "chat 1", "long 1"
  bool isLong = false;
  std::vector<double> ticksMs;                        // every token of the lane's requests
  std::vector<double> requestStartsMs;                // each request's arrival
  std::vector<std::pair<double, double>> prefillMs;   // long: [arrival, first token] of each request
  double stallFromMs = 0, stallToMs = 0;              // chat: the largest gap inside one request
};

struct TimelineModel {
  std::vector<TimelineLane> lanes;  // chat streams in stream order, then long requests in arrival order
  double endMs = 0;                 // the last token (or arrival)
};

// The lanes of one row (one policy's run).
TimelineModel timelineModel(const ServingRow& row);

struct LaidOutLane {
  QRectF rect;                 // the lane's strip
  std::vector<double> tickX;   // a tick per token
  std::vector<double> arrivalX;  // each request's arrival
  std::vector<QRectF> bands;   // prefill bands (long lanes)
  QRectF stall;                // the largest gap (chat lanes; empty when none)
};

// x = plot.left + ms / spanMs * plot.width, lanes stacked top to bottom
// inside plot. spanMs is shared by the policies shown, so that their gaps
// compare at one scale.
std::vector<LaidOutLane> layoutTimeline(const TimelineModel& model, const QRectF& plot, double spanMs);

// One run's lanes under its title (the window shows every run, one above
// the other, or one of them).
struct TimelineGroup {
  QString title;  // empty: no title line
  TimelineModel model;
};

class ServingTimelineWidget : public QWidget {
  Q_OBJECT
 public:
  explicit ServingTimelineWidget(QWidget* parent = nullptr);
  // spanMs: the time axis's end (the longest of the runs compared); 0: this row's end.
  void setRow(const ServingRow& row, double spanMs);
  // Several runs one above the other, each under its title, on one time axis.
  void setRows(const std::vector<std::pair<QString, const ServingRow*>>& rows, double spanMs);
  void clear();
  int groupCount() const { return static_cast<int>(m_groups.size()); }
  const TimelineGroup& group(int i) const { return m_groups.at(static_cast<size_t>(i)); }
  const TimelineModel& model() const;  // the first group's (empty when none)
  // The plot area inside the widget (after the lane labels and the axis).
  QRectF plotRect() const;
  // Group i's lanes' area inside plotRect() (below its title line).
  QRectF groupRect(int i) const;
  double spanMs() const { return m_spanMs; }
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* e) override;

 private:
  int laneCount() const;
  void drawGroupLabels(QPainter& p, const TimelineModel& m, const std::vector<LaidOutLane>& lanes) const;
  int titledGroups() const;

  std::vector<TimelineGroup> m_groups;
  double m_spanMs = 0;
};

}  // namespace phaselab::ui
