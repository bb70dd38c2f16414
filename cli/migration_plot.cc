#include "cli/migration_plot.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cli/gnuplot.h"
#include "gpumigrate/devices/outcome.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string RoundLabel(const RoundReport& x) { return x.final ? "stun" : fmt::format("r{}", x.round); }

// round, label, MiB sent, MiB dirty, ms, start s, average MB/s, final (0/1)
std::string RoundsBlock(const MigrationReport& r) {
  std::string s = "$rounds << EOD\n";
  for (const auto& x : r.rounds) {
    const double rate = x.ms > 0 ? static_cast<double>(x.bytes) / (x.ms / 1e3) / 1e6 : 0;
    s += fmt::format("{} \"{}\" {:.6f} {:.6f} {:.3f} {:.6f} {:.3f} {}\n", x.round, RoundLabel(x), x.bytes / kMiB,
                     x.dirty_bytes / kMiB, x.ms, x.start_ms / 1e3, rate, x.final ? 1 : 0);
  }
  return s + "EOD\n";
}

// The rate between consecutive progress samples: t (s, the interval's end), MB/s.
std::string TraceBlock(const std::vector<ProgressSample>& trace) {
  std::string s = "$trace << EOD\n";
  for (size_t i = 1; i < trace.size(); ++i) {
    const double dt = trace[i].t_s - trace[i - 1].t_s;
    if (dt <= 0 || trace[i].bytes_sent < trace[i - 1].bytes_sent) continue;
    s += fmt::format("{:.6f} {:.3f}\n", trace[i].t_s,
                     static_cast<double>(trace[i].bytes_sent - trace[i - 1].bytes_sent) / dt / 1e6);
  }
  return s + "EOD\n";
}

std::string StunBlock(const MigrationReport& r) {
  std::string s = "$stun << EOD\n";
  for (const auto& [name, ms] : r.stun_breakdown_ms.Phases()) s += fmt::format("\"{}\" {:.3f}\n", name, ms);
  return s + "EOD\n";
}

}  // namespace

std::string MigrationPlotScript(const MigrationReport& r, const std::vector<ProgressSample>& trace,
                                const std::string& title) {
  // noenhanced: device specs and phase names hold underscores, not subscripts.
  std::string s = "set terminal pngcairo noenhanced size 1400,900 font ',10'\n";
  s += RoundsBlock(r) + TraceBlock(trace) + StunBlock(r);
  const size_t pre = static_cast<size_t>(std::count_if(r.rounds.begin(), r.rounds.end(),
                                                         [](const RoundReport& x) { return !x.final; }));
  std::string outcome = std::string(OutcomeName(r.outcome));
  if (!r.status.ok()) outcome += ": " + r.status.message().substr(0, 100);
  s += fmt::format(
      "set multiplot layout 2,2 title \"{}\\n{}, {} of device, {} pre-copy round{}, {} sent in {:.2f} s\" font ',12'\n",
      GnuplotText(title), GnuplotText(outcome), FormatBytes(static_cast<double>(r.device_bytes)), pre,
      pre == 1 ? "" : "s", FormatBytes(static_cast<double>(r.bytes_sent)), r.total_ms / 1e3);
  s += "set style fill solid 0.8 noborder\nset boxwidth 0.7\nset grid y\nset key top right\n";

  // 1: bytes per round.
  s += "set title 'Bytes sent per round (red: the final round, sent during the stun)'\n";
  s += "set ylabel 'MiB'\nset xlabel 'round'\nset yrange [0:*]\n";
  s += "plot $rounds using 0:($8 == 0 ? $3 : NaN):xtic(2) with boxes lc rgb '#4477aa' title 'pre-copy', \\\n"
       "     $rounds using 0:($8 == 1 ? $3 : NaN) with boxes lc rgb '#cc3311' title 'final', \\\n"
       "     $rounds using 0:3:(sprintf('%.1f', $3)) with labels offset 0,0.7 notitle\n";

  // 2: throughput over time.
  s += "set title 'Throughput over time (steps: each round''s average; line: between progress samples)'\n";
  s += "set ylabel 'MB/s'\nset xlabel 'seconds since the session started'\nset xtics autofreq\n";
  if (r.stun_start_ms > 0) {
    s += fmt::format("set object 1 rect from {:.6f},graph 0 to {:.6f},graph 1 fc rgb '#cc3311' fs transparent "
                     "solid 0.25 noborder behind\n",
                     r.stun_start_ms / 1e3, (r.stun_start_ms + r.stun_ms) / 1e3);
    s += fmt::format("set label 1 'stun' at {:.6f},graph 0.05 center tc rgb '#cc3311'\n",
                     (r.stun_start_ms + r.stun_ms / 2) / 1e3);
  }
  if (r.bandwidth_bytes_per_s > 0) {
    s += fmt::format("set arrow 1 from graph 0,first {0:.3f} to graph 1,first {0:.3f} nohead dt 2 lc rgb '#666666'\n",
                     r.bandwidth_bytes_per_s / 1e6);
  }
  s += "plot $rounds using 6:7:($5 / 1000.0):(0) with vectors nohead lw 3 lc rgb '#4477aa' title 'round average', \\\n";
  s += trace.size() > 1 ? "     $trace using 1:2 with linespoints pt 7 ps 0.4 lc rgb '#228833' title 'sampled', \\\n" : "";
  s += fmt::format("     NaN with lines dt 2 lc rgb '#666666' title 'measured pre-copy bandwidth {:.0f} MB/s'\n",
                   r.bandwidth_bytes_per_s / 1e6);
  s += "unset object 1\nunset label 1\nunset arrow 1\n";

  // 3: the dirty set shrinking.
  s += "set title 'Dirty set per round (the bytes of pages each round had to consider)'\n";
  s += "set ylabel 'MiB'\nset xlabel 'round'\n";
  s += "plot $rounds using 0:4:xtic(2) with linespoints pt 7 lw 2 lc rgb '#aa3377' title 'dirty', \\\n"
       "     $rounds using 0:3 with linespoints pt 5 lc rgb '#4477aa' title 'sent'\n";

  // 4: the stun and its breakdown.
  std::string predicted =
      r.predicted_stun_ms >= 0 && std::isfinite(r.predicted_stun_ms) ? fmt::format(", predicted {:.1f} ms", r.predicted_stun_ms)
                                                                     : "";
  s += fmt::format("set title \"Stun {:.1f} ms{}: its phases\"\n", r.stun_ms, predicted);
  s += "set ylabel 'ms'\nset xlabel ''\nset xtics rotate by -20\nunset key\n";
  if (r.stun_breakdown_ms.size() == 0) {
    s += "set label 2 'no stun: the source never stopped' at graph 0.5,graph 0.5 center\nplot NaN notitle\n";
  } else {
    // The axis holds the predicted stun too: an arrow beyond it would be drawn
    // outside this panel, over another.
    double top = r.predicted_stun_ms >= 0 && std::isfinite(r.predicted_stun_ms) ? r.predicted_stun_ms : 0;
    for (const auto& [name, ms] : r.stun_breakdown_ms.Phases()) top = std::max(top, ms);
    s += fmt::format("set yrange [0:{:.3f}]\n", top > 0 ? top * 1.15 : 1.0);
    if (!predicted.empty()) {
      s += fmt::format("set arrow 2 from graph 0,first {0:.3f} to graph 1,first {0:.3f} nohead dt 2 lc rgb '#666666'\n"
                       "set label 3 'predicted stun' at graph 0.98,first {0:.3f} right offset 0,0.6 tc rgb '#666666'\n",
                       r.predicted_stun_ms);
    }
    s += "plot $stun using 0:2:xtic(1) with boxes lc rgb '#cc3311', $stun using 0:2:(sprintf('%.2f', $2)) with labels "
         "offset 0,0.7\n";
  }
  s += "unset multiplot\n";
  return s;
}

void AddMigrationPlotFlag(CLI::App* c, std::string& png) {
  c->add_option("--plot", png,
                "Also draw the migration as a PNG (needs gnuplot): bytes per round, throughput over time with the "
                "stun shaded, the dirty set per round, the stun's phases beside the predicted stun");
}

bool DrawMigrationPlot(const std::string& png, const MigrationReport& r, const ProgressTrace& trace,
                       const std::string& title) {
  return !png.empty() && DrawPlot(png, MigrationPlotScript(r, trace.samples(), title));
}

}  // namespace gpumigrate::cli
