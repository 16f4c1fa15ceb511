#include "gradscope/report/timeline.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gradscope/core/env.h"
#include "gradscope/report/encode.h"

namespace gradscope {
namespace timeline_html {
namespace {

constexpr size_t kComponents = static_cast<size_t>(MemoryComponent::kCount);
// The chart's frame in SVG units: the plot inside the margins.
constexpr double kWidth = 960, kHeight = 320, kLeft = 84, kRight = 16, kTop = 30, kBottom = 34;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr size_t kTopBlocks = 20;
// One colour per component, in MemoryComponent's order.
constexpr const char* kColours[] = {"#4c72b0", "#dd8452", "#55a868", "#c44e52",
                                    "#8172b3", "#937860", "#9a9a9a"};
static_assert(std::size(kColours) == kComponents);

// The section's styles, added to the page's.
const char* const kCss = R"CSS(
.tl-figure { margin: 10px 0 24px 0; }
.tl-chart-box { position: relative; max-width: 960px; }
svg.tl-chart { width: 100%; height: auto; background: #fff; border: 1px solid #eceef1; }
.tl-band { stroke: none; opacity: 0.9; }
.tl-phase { cursor: zoom-in; }
.tl-shade-0 { fill: #f3f5f8; }
.tl-shade-1 { fill: #e7ebf1; }
.tl-phase:hover { fill: #dbe4f3; }
.tl-phase-label { font-size: 10px; fill: #4b5361; text-anchor: middle; pointer-events: none; }
.tl-grid { stroke: #e6e8eb; stroke-width: 1; }
.tl-ytick { font-size: 10px; fill: #4b5361; text-anchor: end; }
.tl-xtick, .tl-xlabel { font-size: 10px; fill: #4b5361; text-anchor: middle; }
.tl-peak { stroke: #b00020; stroke-width: 1.5; stroke-dasharray: 4 3; pointer-events: none; }
.tl-peak-label { font-size: 11px; fill: #b00020; font-weight: 600; }
.tl-tip { position: absolute; pointer-events: none; background: #1d2330; color: #fff;
  font-size: 12px; padding: 4px 8px; border-radius: 4px; max-width: 420px; }
.tl-legend span { font-size: 12px; margin-right: 12px; white-space: nowrap; }
.tl-legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.tl-controls { font-size: 12px; color: #5b6472; margin: 4px 0; }
.tl-controls button { font-size: 12px; padding: 2px 10px; border-radius: 12px;
  border: 1px solid #b9c0ca; background: #fff; cursor: pointer; }
.tl-tables { display: flex; flex-wrap: wrap; gap: 24px; }
tr.tl-differs td { background: #fff4d6; }
.tl-cap { background: #fde2e1; color: #9b1c17; border: 1px solid #e6a29f; padding: 8px 12px;
  border-radius: 6px; }
.tl-note, .tl-about { font-size: 12.5px; color: #4b5361; }
)CSS";

// Each figure: its zoom (the transform of its plot, the x ticks, the phase and peak labels),
// the tooltip that names the component under the pointer, its bytes and the event's module,
// and the phases that zoom when clicked. Marks on the section how many figures it set up
// (data-timelines-drawn) for automated checks. Text from the file is only ever set as
// textContent.
const char* const kScript = R"JS(
(function () {
  var SVGNS = 'http://www.w3.org/2000/svg';
  function fmtBytes(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0, v = b;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(2)) + ' ' + units[i];
  }
  function nums(el, name) {
    var s = el ? el.getAttribute(name) || '' : '';
    return s === '' ? [] : s.split(' ').map(Number);
  }
  function setUp(fig) {
    var svg = fig.querySelector('svg.tl-chart');
    if (!svg) return false;
    var num = function (name) { return Number(svg.getAttribute(name)); };
    var n = num('data-events'), left = num('data-left'), pw = num('data-plot-width');
    var top = num('data-top'), ph = num('data-plot-height'), ymax = num('data-ymax');
    var pts = fig.querySelector('.tl-points');
    var xs = nums(pts, 'data-x'), ts = nums(pts, 'data-t'), lives = nums(pts, 'data-live');
    var lab = nums(pts, 'data-label');
    var labels = Array.prototype.slice.call(fig.querySelectorAll('.tl-labels li'));
    var bands = Array.prototype.slice.call(svg.querySelectorAll('.tl-band')).map(function (b) {
      return { name: b.getAttribute('data-component'), values: nums(b, 'data-values') };
    });
    var plot = svg.querySelector('.tl-plot'), ticks = svg.querySelector('.tl-xticks');
    var tip = fig.querySelector('.tl-tip'), box = fig.querySelector('.tl-chart-box');
    var view = { x0: -0.5, x1: n - 0.5 };
    var k = function () { return pw / (view.x1 - view.x0); };
    var px = function (x) { return left + (x - view.x0) * k(); };
    function layout() {
      plot.setAttribute('transform',
                        'translate(' + (left - view.x0 * k()) + ' 0) scale(' + k() + ' 1)');
      svg.setAttribute('data-x0', String(view.x0));
      svg.setAttribute('data-x1', String(view.x1));
      while (ticks.firstChild) ticks.removeChild(ticks.firstChild);
      var seen = {};
      for (var i = 0; i <= 5; i++) {
        var x = Math.round(view.x0 + 0.5 + (view.x1 - view.x0 - 1) * i / 5);
        if (seen[x]) continue;
        seen[x] = true;
        var t = document.createElementNS(SVGNS, 'text');
        t.setAttribute('class', 'tl-xtick');
        t.setAttribute('x', String(px(x)));
        t.setAttribute('y', String(top + ph + 13));
        t.textContent = String(x);
        ticks.appendChild(t);
      }
      svg.querySelectorAll('.tl-phase-label').forEach(function (l) {
        var a = Math.max(px(Number(l.getAttribute('data-first')) - 0.5), left);
        var b = Math.min(px(Number(l.getAttribute('data-end')) - 0.5), left + pw);
        l.setAttribute('x', String((a + b) / 2));
        l.style.display = b - a >= 6 * l.textContent.length ? '' : 'none';
      });
      var pl = svg.querySelector('.tl-peak-label');
      var at = px(Number(pl.getAttribute('data-event')));
      pl.setAttribute('x', String(Math.min(Math.max(at, left), left + pw)));
      pl.setAttribute('text-anchor', at > left + pw / 2 ? 'end' : 'start');
      pl.style.opacity = at >= left && at <= left + pw ? '1' : '0.5';
    }
    function nearest(x) {
      var lo = 0, hi = xs.length - 1;
      while (hi - lo > 1) {
        var mid = (lo + hi) >> 1;
        if (xs[mid] <= x) lo = mid; else hi = mid;
      }
      return Math.abs(xs[hi] - x) < Math.abs(x - xs[lo]) ? hi : lo;
    }
    svg.addEventListener('mousemove', function (ev) {
      var r = svg.getBoundingClientRect(), s = r.width / svg.viewBox.baseVal.width;
      var sx = (ev.clientX - r.left) / s, sy = (ev.clientY - r.top) / s;
      if (!xs.length || sx < left || sx > left + pw || sy < top || sy > top + ph) {
        tip.hidden = true;
        return;
      }
      var i = nearest(view.x0 + (sx - left) / k());
      var v = (top + ph - sy) / ph * ymax, acc = 0, band = null;
      for (var c = 0; c < bands.length && !band; c++) {
        acc += bands[c].values[i];
        if (v <= acc && bands[c].values[i] > 0) band = bands[c];
      }
      var li = labels[lab[i]];
      tip.textContent = (band ? band.name + ': ' + fmtBytes(band.values[i]) + ' of ' : '') +
          fmtBytes(lives[i]) + ' live after event ' + xs[i] + ' (' + ts[i] + ' ns), by ' +
          (li ? li.textContent + ' in ' + li.getAttribute('data-phase') : '?');
      var b = box.getBoundingClientRect();
      tip.style.left = Math.min(ev.clientX - b.left + 12, b.width - 200) + 'px';
      tip.style.top = (ev.clientY - b.top + 14) + 'px';
      tip.hidden = false;
    });
    svg.addEventListener('mouseleave', function () { tip.hidden = true; });
    svg.querySelectorAll('.tl-phase').forEach(function (p) {
      p.addEventListener('click', function () {
        view.x0 = Number(p.getAttribute('data-first')) - 0.5;
        view.x1 = Number(p.getAttribute('data-end')) - 0.5;
        layout();
      });
    });
    fig.querySelector('.tl-reset').addEventListener('click', function () {
      view.x0 = -0.5;
      view.x1 = n - 0.5;
      layout();
    });
    layout();
    return true;
  }
  var drawn = 0;
  document.querySelectorAll('.tl-figure').forEach(function (fig) { if (setUp(fig)) drawn++; });
  var section = document.getElementById('memory-timeline');
  if (section) section.setAttribute('data-timelines-drawn', String(drawn));
})();
)JS";

std::string bytes_text(int64_t bytes) {
  return fmt::format("{} bytes ({})", bytes, format_bytes(static_cast<double>(bytes)));
}

std::string module_text(const std::string& module) { return module.empty() ? "unnamed" : module; }

// "step 3 backward" for the phase holding event `e`; else the event's label's phase, or where
// it lies against the phases when its label names none.
std::string phase_of(const MemoryTimeline& t, int64_t e) {
  for (const TimelinePhase& p : t.meta.phases)
    if (p.first_event <= e && e < p.end_event) return fmt::format("step {} {}", p.step, p.phase);
  const std::string& phase = t.meta.labels[t.events[e].label].phase;
  if (!phase.empty()) return phase;
  return t.meta.phases.empty() || e < t.meta.phases.front().first_event ? "before the window"
                                                                         : "between phases";
}

double y_of(double bytes, double ymax) { return kTop + kPlotH - bytes / ymax * kPlotH; }

// The stacked bands: for each component with bytes anywhere, a path in event units (x) and
// pixels (y), its values at the drawn points in data-values for the tooltip.
std::string bands_svg(const ReportTimeline& r, const std::vector<int64_t>& points, double ymax) {
  const auto& by = r.replay.by_component;
  std::vector<double> below(points.size(), 0);
  std::string h;
  for (size_t c = 0; c < kComponents; ++c) {
    bool any = false;
    for (int64_t p : points) any = any || by[p][c] > 0;
    if (!any) continue;
    std::string top, bottom, values;
    for (size_t i = 0; i < points.size(); ++i) {
      const double upper = below[i] + static_cast<double>(by[points[i]][c]);
      top += fmt::format("{}{} {:.1f}", i == 0 ? "M" : " L", points[i], y_of(upper, ymax));
      values += fmt::format("{}{}", i == 0 ? "" : " ", by[points[i]][c]);
    }
    for (size_t i = points.size(); i-- > 0;) {
      bottom += fmt::format(" L{} {:.1f}", points[i], y_of(below[i], ymax));
      below[i] += static_cast<double>(by[points[i]][c]);
    }
    const char* name = component_name(static_cast<MemoryComponent>(c));
    h += fmt::format(
        "<path class=\"tl-band\" d=\"{}{} Z\" fill=\"{}\" data-component=\"{}\" "
        "data-values=\"{}\"/>\n",
        top, bottom, kColours[c], name, values);
  }
  return h;
}

// The phases as shaded columns (in event units) that zoom the axis when clicked, and their
// labels (in pixels, placed by the script).
std::pair<std::string, std::string> phases_svg(const MemoryTimeline& t) {
  std::string rects, labels;
  const size_t drawn = std::min(t.meta.phases.size(), kTimelineMaxPhasesDrawn);
  for (size_t i = 0; i < drawn; ++i) {
    const TimelinePhase& p = t.meta.phases[i];
    if (p.end_event <= p.first_event) continue;
    const std::string name = html_escape(fmt::format("step {} {}", p.step, p.phase));
    rects += fmt::format(
        "<rect class=\"tl-phase tl-shade-{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
        "data-first=\"{}\" data-end=\"{}\"><title>{} (events {} to {}): click to zoom"
        "</title></rect>\n",
        i % 2, static_cast<double>(p.first_event) - 0.5, kTop, p.end_event - p.first_event,
        kPlotH, p.first_event, p.end_event, name, p.first_event, p.end_event - 1);
    labels += fmt::format(
        "<text class=\"tl-phase-label\" y=\"{}\" data-first=\"{}\" data-end=\"{}\">{}</text>\n",
        kTop + 11, p.first_event, p.end_event, name);
  }
  return {rects, labels};
}

std::string axes_svg(double ymax) {
  std::string h;
  for (int i = 0; i <= 4; ++i) {
    const double v = ymax * i / 4;
    const double y = y_of(v, ymax);
    h += fmt::format(
        "<line class=\"tl-grid\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>"
        "<text class=\"tl-ytick\" x=\"{}\" y=\"{:.1f}\">{}</text>\n",
        kLeft, kLeft + kPlotW, y, y, kLeft - 6, y + 4, format_bytes(v));
  }
  h += fmt::format(
      "<g class=\"tl-xticks\"></g><text class=\"tl-xlabel\" x=\"{}\" y=\"{}\">event index (the "
      "order of allocations and frees)</text>\n",
      kLeft + kPlotW / 2, kHeight - 4);
  return h;
}

// The hidden lists the tooltip reads: for each drawn point its event, time, total and label
// (an index into the list of labels that follows, whose text is the module).
std::string point_data(const ReportTimeline& r, const std::vector<int64_t>& points) {
  const MemoryTimeline& t = r.timeline;
  std::map<uint32_t, size_t> used;
  std::string xs, ts, lives, labels;
  for (size_t i = 0; i < points.size(); ++i) {
    const TimelineEvent& e = t.events[points[i]];
    const auto it = used.emplace(e.label, used.size()).first;
    const char* sep = i == 0 ? "" : " ";
    xs += fmt::format("{}{}", sep, points[i]);
    ts += fmt::format("{}{}", sep, e.t_ns);
    lives += fmt::format("{}{}", sep, r.replay.live[points[i]]);
    labels += fmt::format("{}{}", sep, it->second);
  }
  std::vector<uint32_t> order(used.size());
  for (const auto& [label, index] : used) order[index] = label;
  std::string h = fmt::format(
      "<div class=\"tl-points\" hidden data-x=\"{}\" data-t=\"{}\" data-live=\"{}\" "
      "data-label=\"{}\"></div>\n<ol class=\"tl-labels\" hidden>",
      xs, ts, lives, labels);
  for (uint32_t label : order) {
    const TimelineLabel& l = t.meta.labels[label];
    h += fmt::format("<li data-phase=\"{}\">{}</li>", html_escape(l.phase),
                     html_escape(module_text(l.module)));
  }
  return h + "</ol>\n";
}

std::string chart_svg(const ReportTimeline& r, size_t index, double ymax) {
  const MemoryTimeline& t = r.timeline;
  const TimelineReplay& rp = r.replay;
  const auto n = static_cast<int64_t>(t.events.size());
  const std::vector<int64_t> points = timeline_points(rp.live, kTimelineMaxPoints);
  const auto [phase_rects, phase_labels] = phases_svg(t);
  std::string h = fmt::format(
      "<div class=\"tl-chart-box\"><svg class=\"tl-chart\" viewBox=\"0 0 {} {}\" "
      "xmlns=\"http://www.w3.org/2000/svg\" data-events=\"{}\" data-ymax=\"{:.0f}\" "
      "data-left=\"{}\" data-plot-width=\"{}\" data-top=\"{}\" data-plot-height=\"{}\" "
      "data-drawn-points=\"{}\">\n<clipPath id=\"tl-clip-{}\"><rect x=\"{}\" y=\"{}\" "
      "width=\"{}\" height=\"{}\"/></clipPath>\n",
      kWidth, kHeight, n, ymax, kLeft, kPlotW, kTop, kPlotH, points.size(), index, kLeft, kTop,
      kPlotW, kPlotH);
  h += axes_svg(ymax);
  // Event units across, pixels down; the script sets the transform to zoom.
  const double k = kPlotW / static_cast<double>(n);
  h += fmt::format(
      "<g clip-path=\"url(#tl-clip-{})\"><g class=\"tl-plot\" transform=\"translate({} 0) "
      "scale({} 1)\">\n",
      index, kLeft + 0.5 * k, k);
  h += phase_rects + bands_svg(r, points, ymax);
  h += fmt::format(
      "<line class=\"tl-peak\" x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2:.1f}\" "
      "vector-effect=\"non-scaling-stroke\" data-peak-bytes=\"{3}\" data-peak-event=\"{0}\"/>\n",
      rp.peak_event, kTop, kTop + kPlotH, rp.peak_bytes);
  h += "</g></g>\n" + phase_labels;
  h += fmt::format(
      "<text class=\"tl-peak-label\" y=\"{}\" data-event=\"{}\">peak {} in {} (event {})</text>\n",
      kTop - 8, rp.peak_event, html_escape(bytes_text(rp.peak_bytes)),
      html_escape(phase_of(t, rp.peak_event)), rp.peak_event);
  h += "</svg><div class=\"tl-tip\" hidden></div></div>\n";
  h += point_data(r, points);
  h += "<div class=\"tl-legend\">";
  for (size_t c = 0; c < kComponents; ++c)
    h += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", kColours[c],
                     component_name(static_cast<MemoryComponent>(c)));
  h += "</div>\n";
  if (points.size() < t.events.size())
    h += fmt::format(
        "<p class=\"tl-note\">Drawn from {} of the {} events: in each of {} equal runs of "
        "events the one of the largest and the one of the smallest live total, so every run's "
        "maximum, the peak among them, is drawn. Zoomed, a phase shows the same points.</p>\n",
        points.size(), t.events.size(), (kTimelineMaxPoints - 2) / 2);
  if (t.meta.phases.size() > kTimelineMaxPhasesDrawn)
    h += fmt::format("<p class=\"tl-note\">The first {} of its {} phases are shaded.</p>\n",
                     kTimelineMaxPhasesDrawn, t.meta.phases.size());
  return h;
}

// The largest blocks live at the peak: module, component, bytes, and the tensor where the file
// names the block.
std::string blocks_table(const ReportTimeline& r) {
  const MemoryTimeline& t = r.timeline;
  std::map<int64_t, const TimelineTensor*> tensors;
  for (const TimelineTensor& x : t.meta.tensors) tensors.emplace(x.event, &x);
  const auto& blocks = r.replay.live_at_peak;
  std::string h = fmt::format(
      "<table class=\"tl-blocks\"><caption>The {} largest of the {} blocks live at the peak"
      "</caption>\n<thead><tr><th>module</th><th>component</th><th>bytes</th><th>tensor</th>"
      "<th>shape</th><th>dtype</th><th>allocated</th></tr></thead>\n<tbody>\n",
      std::min(blocks.size(), kTopBlocks), blocks.size());
  for (size_t i = 0; i < std::min(blocks.size(), kTopBlocks); ++i) {
    const TimelineReplay::LiveBlock& b = blocks[i];
    const TimelineLabel& l = t.meta.labels[b.label];
    const auto it = tensors.find(b.alloc_event);
    std::string name, shape, dtype;
    if (it != tensors.end()) {
      name = it->second->name;
      dtype = it->second->dtype;
      shape = "[" + fmt::format("{}", fmt::join(it->second->shape, ", ")) + "]";
    }
    const std::string when =
        b.alloc_event < 0 ? "before the window (unnamed)"
                          : fmt::format("event {}, {}", b.alloc_event, phase_of(t, b.alloc_event));
    h += fmt::format(
        "<tr data-bytes=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        b.bytes, html_escape(module_text(l.module)), component_name(l.component),
        html_escape(bytes_text(b.bytes)), html_escape(name), html_escape(shape),
        html_escape(dtype), html_escape(when));
  }
  return h + "</tbody></table>\n";
}

// The estimate at its predicted peak against the timeline at its peak, component by component.
std::string estimate_table(const ReportTimeline& r) {
  const TimelineMeta& m = r.timeline.meta;
  const TimelineReplay& rp = r.replay;
  if (m.estimate.empty())
    return "<p class=\"tl-estimate-none\">This run's combination has no estimate to compare "
           "with.</p>\n";
  const double threshold = kTimelineDifferShare * static_cast<double>(rp.peak_bytes);
  std::string h = fmt::format(
      "<table class=\"tl-estimate\"><caption>The estimate at its predicted peak ({}, in {}) "
      "against the timeline at its peak ({})</caption>\n<thead><tr><th>component</th>"
      "<th>estimate</th><th>timeline</th><th>estimate - timeline</th><th>differs</th></tr>"
      "</thead>\n<tbody>\n",
      html_escape(bytes_text(m.estimate_peak_bytes)), html_escape(m.estimate_peak_phase),
      html_escape(bytes_text(rp.peak_bytes)));
  std::vector<std::string> differing;
  for (size_t c = 0; c < kComponents; ++c) {
    const char* name = component_name(static_cast<MemoryComponent>(c));
    const auto it = m.estimate.find(name);
    const int64_t estimate = it == m.estimate.end() ? 0 : it->second;
    const int64_t measured = rp.peak_event >= 0 ? rp.by_component[rp.peak_event][c] : 0;
    if (estimate == 0 && measured == 0) continue;
    const double diff = static_cast<double>(estimate) - static_cast<double>(measured);
    const bool differs = std::fabs(diff) > threshold;
    if (differs) differing.push_back(name);
    h += fmt::format(
        "<tr class=\"{}\" data-component=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td>"
        "<td>{}</td></tr>\n",
        differs ? "tl-differs" : "", name, name, html_escape(bytes_text(estimate)),
        html_escape(bytes_text(measured)), diff > 0 ? "+" : diff < 0 ? "-" : "",
        html_escape(format_bytes(std::fabs(diff))),
        differs ? (diff > 0 ? "estimate higher" : "estimate lower") : "");
  }
  h += "</tbody></table>\n";
  h += differing.empty()
           ? std::string("<p class=\"tl-verdict\">No component differs by more than 10% of the "
                         "timeline's peak.</p>\n")
           : fmt::format("<p class=\"tl-verdict\">Differ by more than 10% of the timeline's "
                         "peak: <b>{}</b>.</p>\n",
                         fmt::join(differing, ", "));
  return h;
}

std::string cap_warning(const TimelineMeta& m) {
  if (!m.cap_reached) return "";
  return fmt::format(
      "<p class=\"tl-cap\"><b>The file's size cap ({}) was reached:</b> {} events after it were "
      "dropped, so the timeline stops early and its peak may lie below the run's (the "
      "tracker's own peak over the window was {}).</p>\n",
      html_escape(bytes_text(m.cap_bytes)), m.dropped_events,
      html_escape(bytes_text(m.window_peak_bytes)));
}

std::string timeline_figure(const ReportTimeline& r, size_t index, double ymax) {
  const TimelineMeta& m = r.timeline.meta;
  std::string h = fmt::format(
      "<div class=\"tl-figure\" data-run-id=\"{}\">\n<h3>{}</h3>\n<p class=\"tl-about\">{} "
      "{} to {}, {} events; from {}.</p>\n",
      html_escape(m.run_id), html_escape(m.run_id.empty() ? "(no run id)" : m.run_id),
      m.device.empty() ? std::string("Steps") : "On " + html_escape(m.device) + ", steps",
      m.first_step, m.last_step, m.events, html_escape(r.path));
  h += cap_warning(m);
  if (r.timeline.events.empty()) return h + "<p>The window holds no events.</p>\n</div>\n";
  h += "<div class=\"tl-controls\"><button type=\"button\" class=\"tl-reset\">whole window"
       "</button> click a phase to zoom into it</div>\n";
  h += chart_svg(r, index, ymax);
  h += "<div class=\"tl-tables\"><div>" + blocks_table(r) + "</div><div>" + estimate_table(r) +
       "</div></div>\n";
  return h + "</div>\n";
}

}  // namespace
}  // namespace timeline_html

ReportTimeline load_report_timeline(const std::string& path) {
  ReportTimeline r;
  r.path = path;
  r.timeline = read_memory_timeline(path);
  r.replay = replay_memory_timeline(r.timeline, path);
  return r;
}

std::vector<int64_t> timeline_points(const std::vector<int64_t>& live, size_t max_points) {
  const auto n = static_cast<int64_t>(live.size());
  std::vector<int64_t> out;
  if (live.size() <= max_points || max_points < 4) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  const auto runs = static_cast<int64_t>((max_points - 2) / 2);
  out.push_back(0);
  for (int64_t b = 0; b < runs; ++b) {
    const int64_t from = b * n / runs, to = (b + 1) * n / runs;
    int64_t hi = from, lo = from;
    for (int64_t i = from; i < to; ++i) {
      if (live[i] > live[hi]) hi = i;
      if (live[i] < live[lo]) lo = i;
    }
    out.push_back(std::min(hi, lo));
    out.push_back(std::max(hi, lo));
  }
  out.push_back(n - 1);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string timeline_section_html(const std::vector<ReportTimeline>& timelines) {
  if (timelines.empty()) return "";
  double ymax = 1;
  for (const ReportTimeline& r : timelines)
    ymax = std::max(ymax, static_cast<double>(r.replay.peak_bytes));
  std::string h =
      "<section id=\"memory-timeline\"><h2>Memory timeline</h2>\n<p>Every allocation and free "
      "of tensor storage in the steps a run watched (<code>gradscope run --memory-timeline"
      "</code>), the live bytes stacked by component along the event index (the order of the "
      "events; hover for the time). A block is counted as the component its last label gives "
      "it, from its allocation on. The phases are shaded: click one to zoom into it. Beside "
      "the largest blocks live at the peak, the estimate's breakdown at its predicted peak "
      "against the timeline's at its own: a component is named as differing where the two "
      "differ by more than 10% of the timeline's peak.</p>\n";
  if (timelines.size() > 1)
    h += "<p>The timelines are drawn one above the other on the same byte scale.</p>\n";
  for (size_t i = 0; i < timelines.size(); ++i)
    h += timeline_html::timeline_figure(timelines[i], i, ymax);
  return h + "</section>\n";
}

const char* timeline_css() { return timeline_html::kCss; }

const char* timeline_script() { return timeline_html::kScript; }

}  // namespace gradscope
