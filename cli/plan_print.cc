#include "cli/plan_print.h"

#include "cli/print.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpumigrate::cli {

using planner::Action;
using planner::Plan;
using planner::PlannedAction;

namespace {

std::string Sec(int64_t ms) { return fmt::format("{:.1f} s", static_cast<double>(ms) / 1e3); }

std::string TargetText(const PlannedAction& a) {
  if (!a.to) return "-";
  std::string gpus;
  for (uint32_t g : a.to->gpus) gpus += fmt::format("{}{}", gpus.empty() ? "" : ",", g);
  std::string s = fmt::format("{} gpu {}", a.to->host, gpus);
  if (a.to->placement) s += fmt::format(" slice {}", *a.to->placement);
  return s;
}

}  // namespace

void PrintPlan(FILE* out, const Plan& p) {
  Print(out, "gpumigrate plan: evacuate {}: {}\n", p.host,
             p.feasible ? "feasible" : "NOT feasible");
  if (!p.feasible) Print(out, "  {}\n", p.reason);
  Print(out, "  total {} pipelined ({}), {} in fixed batches\n", Sec(p.total_ms),
             p.used_batched ? "no shorter than batches: runs batched" : "each action starts as a slot frees",
             Sec(p.batched_total_ms));
  if (!p.search_exact) {
    Print(out, "  placement: the exact search ran out of budget after {} evaluations; best assignment found\n",
               p.search_evaluations);
  }
  size_t vm_w = 2, tgt_w = 6;
  for (const auto& a : p.actions) {
    vm_w = std::max(vm_w, a.vm.size());
    tgt_w = std::max(tgt_w, TargetText(a).size());
  }
  Print(out, "\n{:<{}}  {:<17}  {:<{}}  {:>9}  {:>9}  {:>9}  {}\n", "VM", vm_w, "ACTION", "TARGET", tgt_w, "STUN",
             "START", "END", "REASON");
  for (const auto& a : p.actions) {
    bool timed = a.action == Action::kLiveMigrate || a.action == Action::kDrainAndReplace ||
                 a.action == Action::kPowerOff;
    Print(out, "{:<{}}  {:<17}  {:<{}}  {:>9}  {:>9}  {:>9}  {}\n", a.vm, vm_w, planner::ActionName(a.action),
               TargetText(a), tgt_w, a.action == Action::kLiveMigrate ? Sec(a.predicted_stun_ms) : "-",
               timed ? Sec(a.start_ms) : "-", timed ? Sec(a.end_ms) : "-", a.reason);
  }
  // Timeline: '=' migrating, '#' stunned, '~' replacement starting and draining, 'X' powered off.
  const int width = 60;
  int64_t span = std::max<int64_t>(p.total_ms, 1);
  Print(out, "\ntimeline, 0 to {} ('=' migrating, '#' stun, '~' replace and drain, 'X' power-off):\n",
             Sec(p.total_ms));
  auto col = [&](int64_t ms) { return static_cast<int>(static_cast<double>(ms) * width / static_cast<double>(span)); };
  for (const auto& a : p.actions) {
    std::string lane(width + 1, ' ');
    if (a.action == Action::kLiveMigrate || a.action == Action::kDrainAndReplace) {
      int from = col(a.start_ms), to = std::max(from + 1, col(a.end_ms));
      for (int c = from; c < to && c <= width; ++c) lane[c] = a.action == Action::kLiveMigrate ? '=' : '~';
      if (a.action == Action::kLiveMigrate) {
        int stun_from = std::min(to - 1, col(a.end_ms - a.predicted_stun_ms));
        for (int c = stun_from; c < to && c <= width; ++c) lane[c] = '#';
      }
    } else if (a.action == Action::kPowerOff) {
      lane[std::min(width, col(a.start_ms))] = 'X';
    } else {
      lane = std::string("blocked");
    }
    Print(out, "  {:<{}} |{}|\n", a.vm, vm_w, lane);
  }
}

std::string PlanGnuplotScript(const Plan& p) {
  std::string s;
  size_t n = p.actions.size();
  s += "set terminal pngcairo size 1200," + std::to_string(160 + 40 * n) + "\n";
  s += fmt::format("set title \"Evacuation of {}: {:.1f} s pipelined, {:.1f} s batched{}\"\n", p.host,
                   p.total_ms / 1e3, p.batched_total_ms / 1e3, p.feasible ? "" : " (NOT feasible)");
  s += "set xlabel 'seconds'\nset yrange [-0.5:" + std::to_string(n) + "-0.5]\nunset key\nset grid x\n";
  s += "set ytics (";
  for (size_t i = 0; i < n; ++i) {
    s += fmt::format("{}\"{}\" {}", i ? ", " : "", p.actions[i].vm, n - 1 - i);
  }
  s += ")\n";
  int obj = 1;
  auto rect = [&](double from, double to, double y, const char* colour) {
    s += fmt::format("set object {} rect from {:.3f},{:.2f} to {:.3f},{:.2f} fc rgb '{}' fs solid 0.8 noborder\n",
                     obj++, from, y - 0.3, to, y + 0.3, colour);
  };
  for (size_t i = 0; i < n; ++i) {
    const auto& a = p.actions[i];
    double y = static_cast<double>(n - 1 - i);
    double st = a.start_ms / 1e3, en = a.end_ms / 1e3;
    if (a.action == Action::kLiveMigrate) {
      rect(st, en, y, "#4477aa");
      rect(en - a.predicted_stun_ms / 1e3, en, y, "#cc3311");
    } else if (a.action == Action::kDrainAndReplace) {
      rect(st, en, y, "#228833");
    } else if (a.action == Action::kPowerOff) {
      s += fmt::format("set label {} 'power-off' at {:.3f},{:.2f} right offset -0.5,0 tc rgb '#000000'\n", obj++, st, y);
    } else {
      s += fmt::format("set label {} 'blocked' at 0,{:.2f} tc rgb '#cc3311'\n", obj++, y);
    }
  }
  double xmax = std::max(1.0, std::max(p.total_ms, p.batched_total_ms) / 1e3) * 1.05;
  s += fmt::format("set xrange [0:{:.3f}]\n", xmax);
  s += "set label 1000 'blue: migrating, red: stun, green: replace + drain' at graph 0.01, graph 1.04\n";
  s += "plot NaN\n";
  return s;
}

}  // namespace gpumigrate::cli
