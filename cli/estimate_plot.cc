#include "cli/estimate_plot.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "cli/gnuplot.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double Ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }

bool EverWritten(const RegionProfile& rp) {
  return std::any_of(rp.dirty.high_bytes.begin(), rp.dirty.high_bytes.end(), [](double b) { return b > 0; });
}

// window ms, lowest, median, highest MiB dirtied in a window that long.
std::string WorkingSetBlock(size_t i, const WorkingSetCurve& w) {
  std::string s = fmt::format("$w{} << EOD\n", i);
  const size_t n = std::min({w.window_s.size(), w.low_bytes.size(), w.mid_bytes.size(), w.high_bytes.size()});
  for (size_t k = 0; k < n; ++k) {
    s += fmt::format("{:.3f} {:.6f} {:.6f} {:.6f}\n", w.window_s[k] * 1e3, w.low_bytes[k] / kMiB,
                     w.mid_bytes[k] / kMiB, w.high_bytes[k] / kMiB);
  }
  return s + "EOD\n";
}

// round, label, MiB, seconds, final (0/1): the pre-copy rounds, then the bytes
// sent during the stun.
std::string RoundsBlock(const std::string& name, const ModelRun& m) {
  std::string s = fmt::format("${} << EOD\n", name);
  for (const auto& x : m.rounds) {
    s += fmt::format("{} \"r{}\" {:.6f} {:.6f} 0\n", x.round, x.round, x.bytes / kMiB, x.seconds);
  }
  s += fmt::format("{} \"stun\" {:.6f} {:.6f} 1\n", m.rounds.size(), m.final_bytes / kMiB, m.stun_ms / 1e3);
  return s + "EOD\n";
}

double PreCopySeconds(const ModelRun& m) {
  double t = 0;
  for (const auto& x : m.rounds) t += x.seconds;
  return t;
}

// seconds, MiB sent so far: from the start, at the end of each round and of the stun.
std::string TimelineBlock(const std::string& name, const ModelRun& m) {
  std::string s = fmt::format("${} << EOD\n0.000000 0.000000\n", name);
  double t = 0, sent = 0;
  for (const auto& x : m.rounds) {
    t += x.seconds;
    sent += x.bytes;
    s += fmt::format("{:.6f} {:.6f}\n", t, sent / kMiB);
  }
  s += fmt::format("{:.6f} {:.6f}\n", t + m.stun_ms / 1e3, (sent + m.final_bytes) / kMiB);
  return s + "EOD\n";
}

// decision (the round after which the engine decided), predicted stun ms.
std::string DecisionsBlock(const std::string& name, const std::vector<double>& stun_ms) {
  std::string s = fmt::format("${} << EOD\n", name);
  for (size_t k = 0; k < stun_ms.size(); ++k) s += fmt::format("{} {:.3f}\n", k, stun_ms[k]);
  return s + "EOD\n";
}

std::string Reason(const ModelRun& m) {
  return m.beside_paused_first ? "QEMU paused the guest" : std::string(StopReasonName(m.stop_reason));
}

std::string WorkingSetPanel(const EstimateReport& r) {
  static constexpr const char* kColours[] = {"#aa3377", "#4477aa", "#228833", "#ccbb44", "#66ccee", "#ee6677"};
  std::string s;
  std::vector<std::string> quiet;
  std::string plot;
  size_t drawn = 0;
  for (size_t i = 0; i < r.modelled.regions.size(); ++i) {
    const RegionProfile& rp = r.modelled.regions[i];
    if (rp.dirty.window_s.empty() || !EverWritten(rp)) {
      quiet.push_back(rp.info.name);
      continue;
    }
    const char* colour = kColours[drawn++ % std::size(kColours)];
    s += WorkingSetBlock(i, rp.dirty);
    plot += fmt::format("{}$w{} using 1:2:4 with filledcurves fc rgb '{}' fs transparent solid 0.2 notitle, \\\n"
                        "     $w{} using 1:3 with linespoints pt 7 ps 0.5 lw 2 lc rgb '{}' title \"{}\", \\\n",
                        plot.empty() ? "plot " : "     ", i, colour, i, colour, GnuplotText(rp.info.name));
  }
  std::string never;
  for (const auto& q : quiet) never += (never.empty() ? "" : ", ") + q;
  s += fmt::format("set title \"Dirty working set W(t), measured over {:.2f} s (band: lowest to highest window){}\"\n",
                   r.measured.sample_s, never.empty() ? "" : "\\nnever written: " + GnuplotText(never));
  s += "set ylabel 'MiB dirtied in a window'\nset xlabel 'window (ms)'\nset logscale x\nset yrange [0:*]\n"
       "set key top left\n";
  // Each predicted round's length: the next round sends about W of it.
  int arrow = 10;
  for (const auto& x : r.prediction.mid.rounds) {
    if (x.seconds <= 0) continue;
    s += fmt::format("set arrow {} from first {:.3f},graph 0 to first {:.3f},graph 1 nohead dt 3 lc rgb '#666666'\n",
                     arrow++, x.seconds * 1e3, x.seconds * 1e3);
  }
  if (plot.empty()) {
    s += "set label 2 'nothing was written while observed' at graph 0.5,graph 0.5 center\nplot NaN notitle\n"
         "unset label 2\n";
  } else {
    s += plot + "     NaN with lines dt 3 lc rgb '#666666' title 'predicted rounds'' lengths'\n";
  }
  for (int a = 10; a < arrow; ++a) s += fmt::format("unset arrow {}\n", a);
  return s + "unset logscale x\n";
}

std::string RoundsPanel() {
  std::string s = "set title \"Bytes per predicted round\\n(bars: the likely run, red: sent during the stun; marks: "
                  "the optimistic and pessimistic runs)\"\n";
  s += "set ylabel 'MiB'\nset xlabel 'round'\nset logscale y\nset yrange [*:*]\nset key top right\n";
  s += "plot $mid using 1:($5 == 0 ? $3 : NaN):xtic(2) with boxes lc rgb '#4477aa' title 'likely', \\\n"
       "     $mid using 1:($5 == 1 ? $3 : NaN) with boxes lc rgb '#cc3311' title 'final (likely)', \\\n"
       "     $low using 1:3 with points pt 6 ps 1.2 lc rgb '#228833' title 'optimistic', \\\n"
       "     $high using 1:3 with points pt 4 ps 1.2 lc rgb '#aa3377' title 'pessimistic', \\\n"
       "     $mid using 1:3:(sprintf('%.1f', $3)) with labels offset 0,0.7 notitle\n";
  return s + "unset logscale y\n";
}

std::string TimelinePanel(const EstimateReport& r) {
  const ModelRun& m = r.prediction.mid;
  const double stop = PreCopySeconds(m);
  std::string s = fmt::format(
      "set title \"Bytes sent over time: total {:.2f} s (range {:.2f} to {:.2f} s), the likely stun shaded\"\n",
      m.total_ms / 1e3, r.prediction.total_low_ms / 1e3, r.prediction.total_high_ms / 1e3);
  s += "set ylabel 'MiB sent'\nset xlabel 'seconds from the start'\nset xtics autofreq\nset yrange [0:*]\n"
       "set key bottom right\n";
  if (m.stun_ms > 0) {
    s += fmt::format("set object 1 rect from {:.6f},graph 0 to {:.6f},graph 1 fc rgb '#cc3311' fs transparent "
                     "solid 0.25 noborder behind\n",
                     stop, stop + m.stun_ms / 1e3);
  }
  s += "plot $tmid using 1:2 with linespoints pt 7 lw 2 lc rgb '#4477aa' title 'likely', \\\n"
       "     $tlow using 1:2 with linespoints pt 6 dt 2 lc rgb '#228833' title 'optimistic', \\\n"
       "     $thigh using 1:2 with linespoints pt 4 dt 2 lc rgb '#aa3377' title 'pessimistic'\n";
  return s + "unset object 1\n";
}

std::string RulePanel(const EstimateReport& r) {
  const Prediction& p = r.prediction;
  const double target = Ms(r.params.downtime_target);
  const double max_stun = Ms(r.params.max_stun);
  std::string s = fmt::format("set title \"Switchover rule: the stun predicted at each decision\\nstun {:.1f} ms "
                              "(range {:.1f} to {:.1f}){}\"\n",
                              p.mid.stun_ms, p.stun_low_ms, p.stun_high_ms,
                              p.alternative ? fmt::format(", or {:.1f} ms near the target", p.alternative->stun_ms) : "");
  s += "set ylabel 'ms'\nset xlabel 'after round'\nset xtics 1\nset logscale y\nset key top right\n";
  size_t decisions = p.mid.decision_stun_ms.size();
  if (p.alternative) decisions = std::max(decisions, p.alternative->decision_stun_ms.size());
  // The first and last decisions inside the frame, not on it.
  s += fmt::format("set xrange [-0.5:{:.1f}]\n", std::max<double>(static_cast<double>(decisions) - 0.5, 0.5));
  double top = std::max({target, p.stun_high_ms, p.mid.stun_ms});
  double bottom = std::min({target, p.stun_low_ms > 0 ? p.stun_low_ms : target, p.mid.stun_ms > 0 ? p.mid.stun_ms : target});
  for (double d : p.mid.decision_stun_ms) {
    if (d > 0) top = std::max(top, d), bottom = std::min(bottom, d);
  }
  const bool show_max = max_stun > 0 && max_stun <= top * 10;
  if (show_max) top = std::max(top, max_stun);
  s += fmt::format("set yrange [{:.3f}:{:.3f}]\n", std::max(bottom / 2, 0.001), std::max(top * 2, 0.002));
  s += fmt::format("set object 2 rect from graph 0,first {:.3f} to graph 1,first {:.3f} fc rgb '#cc3311' fs "
                   "transparent solid 0.2 noborder behind\n",
                   std::max(p.stun_low_ms, 0.001), std::max(p.stun_high_ms, 0.001));
  s += fmt::format("set arrow 2 from graph 0,first {0:.3f} to graph 1,first {0:.3f} nohead lw 2 lc rgb '#cc3311'\n",
                   std::max(p.mid.stun_ms, 0.001));
  s += fmt::format("set arrow 3 from graph 0,first {0:.3f} to graph 1,first {0:.3f} nohead dt 2 lc rgb '#228833'\n"
                   "set label 3 'downtime target {0:.0f} ms' at graph 0.02,first {0:.3f} left offset 0,0.6 "
                   "tc rgb '#228833'\n",
                   target);
  if (show_max) {
    s += fmt::format("set arrow 4 from graph 0,first {0:.3f} to graph 1,first {0:.3f} nohead dt 2 lc rgb '#000000'\n"
                     "set label 4 'max stun {0:.0f} ms' at graph 0.02,first {0:.3f} left offset 0,0.6\n",
                     max_stun);
  }
  if (p.mid.decision_stun_ms.empty()) {
    s += "set label 5 'no decision modelled' at graph 0.5,graph 0.5 center\nplot NaN notitle\n";
  } else {
    s += "plot $dec using 1:($2 > 0 ? $2 : NaN) with linespoints pt 7 lw 2 lc rgb '#4477aa' title 'likely run', \\\n";
    if (p.alternative && !p.alternative->decision_stun_ms.empty()) {
      s += "     $alt using 1:($2 > 0 ? $2 : NaN) with linespoints pt 6 dt 2 lc rgb '#ee7733' title 'near the "
           "target: the other outcome', \\\n";
    }
    s += "     NaN with lines lw 2 lc rgb '#cc3311' title 'predicted stun (band: its range)'\n";
  }
  return s;
}

}  // namespace

std::string EstimatePlotScript(const EstimateReport& r, const std::string& title) {
  const Prediction& p = r.prediction;
  // noenhanced: region names and device specs hold underscores, not subscripts.
  std::string s = "set terminal pngcairo noenhanced size 1400,900 font ',10'\n";
  s += RoundsBlock("mid", p.mid) + RoundsBlock("low", p.low) + RoundsBlock("high", p.high);
  s += TimelineBlock("tmid", p.mid) + TimelineBlock("tlow", p.low) + TimelineBlock("thigh", p.high);
  s += DecisionsBlock("dec", p.mid.decision_stun_ms);
  if (p.alternative) s += DecisionsBlock("alt", p.alternative->decision_stun_ms);
  std::string link = r.link_source.substr(0, 140);
  s += fmt::format(
      "set multiplot layout 2,2 title \"{}\\n{}: stun {:.1f} ms (range {:.1f} to {:.1f}), {} pre-copy round{}, then "
      "stop ({})\\nbandwidth: {}\" font ',12'\n",
      GnuplotText(title), EstimateDecisionName(p.decision), p.mid.stun_ms, p.stun_low_ms, p.stun_high_ms,
      p.mid.rounds.size(), p.mid.rounds.size() == 1 ? "" : "s", GnuplotText(Reason(p.mid)), GnuplotText(link));
  s += "set style fill solid 0.8 noborder\nset boxwidth 0.7\nset grid y\n";
  s += WorkingSetPanel(r);
  s += RoundsPanel();
  s += TimelinePanel(r);
  s += RulePanel(r);
  s += "unset multiplot\n";
  return s;
}

bool DrawEstimatePlot(const std::string& png, const EstimateReport& r, const std::string& title) {
  return !png.empty() && DrawPlot(png, EstimatePlotScript(r, title));
}

}  // namespace gpumigrate::cli
