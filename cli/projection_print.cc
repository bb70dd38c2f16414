#include "cli/projection_print.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "cli/print.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {
namespace {

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    if (comma > start) out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::string Seconds(double ms) {
  if (!std::isfinite(ms)) return "never";
  return ms < 10'000 ? fmt::format("{:.2f} s", ms / 1e3) : fmt::format("{:.1f} s", ms / 1e3);
}

constexpr double kVmotionStunMs = 21'000;
constexpr const char* kVmotion =
    "published, not ours: VMware vMotion of an 8x H100 80 GB vGPU VM at 100 Gbit (VCF 9.0, ~70% static memory "
    "pre-copied): 21 s stun";

}  // namespace

Result<std::vector<uint32_t>> ParseGpuList(const std::string& text) {
  std::vector<uint32_t> out;
  for (const std::string& s : Split(text)) {
    auto v = ParseUint(s, 1);
    if (!v.ok() || *v > 4096) return InvalidArgument(fmt::format("--table-gpus: '{}' is not a GPU count", s));
    out.push_back(static_cast<uint32_t>(*v));
  }
  if (out.empty()) return InvalidArgument("--table-gpus: no GPU count given");
  return out;
}

Result<std::vector<std::string>> ParseLinkList(const std::string& text) {
  std::vector<std::string> out = Split(text);
  for (const std::string& s : out) {
    auto r = ParseRateBytesPerS(s);
    if (!r.ok()) return r.status().WithContext("--table-links");
  }
  if (out.empty()) return InvalidArgument("--table-links: no link given");
  return out;
}

void PrintProjectionTable(FILE* out, const ProjectionTable& t) {
  if (t.cells.empty()) return;
  Print(out, "gpumigrate estimate: projection table ({})\n", t.cells.back().estimate.modelled.device);
  Print(out, "  {:>4}  {:>9}  {:>22}  {:>9}  {:>6}  {:<17}  {:>13}  {}\n", "GPUs", "link", "stun (range)", "total",
        "rounds", "decision", "stop-and-copy", "bound by");
  for (const auto& c : t.cells) {
    const Prediction& p = c.estimate.prediction;
    Print(out, "  {:>4}  {:>9}  {:>22}  {:>9}  {:>6}  {:<17}  {:>13}  {}\n", c.gpus, c.link,
          fmt::format("{} ({:.1f}-{:.1f})", Seconds(p.mid.stun_ms), p.stun_low_ms / 1e3, p.stun_high_ms / 1e3),
          Seconds(p.mid.total_ms), p.mid.rounds.size(), EstimateDecisionName(p.decision),
          Seconds(c.stop_and_copy_stun_ms), c.estimate.pipeline ? c.estimate.pipeline->binds : "");
  }
  Print(out, "  {}\n", kVmotion);
  Print(out, "  assumptions (of the last row; the others differ only in GPU count and link):\n");
  for (const auto& a : t.assumptions) Print(out, "    - {}\n", a);
}

Status WriteProjectionSvg(const ProjectionTable& t, const std::string& path) {
  constexpr double W = 720, H = 440, L = 70, R = 180, T = 40, B = 50;
  std::map<std::string, std::vector<const ProjectionCell*>> by_link;
  std::vector<std::string> order;
  double max_ms = kVmotionStunMs;
  uint32_t max_gpus = 1;
  for (const auto& c : t.cells) {
    if (!by_link.count(c.link)) order.push_back(c.link);
    by_link[c.link].push_back(&c);
    for (double v : {c.estimate.prediction.mid.stun_ms, c.stop_and_copy_stun_ms}) {
      if (std::isfinite(v)) max_ms = std::max(max_ms, v);
    }
    max_gpus = std::max(max_gpus, c.gpus);
  }
  // Log scale from 10 ms to the largest stun.
  const double lo = std::log10(10.0), hi = std::log10(max_ms * 1.5);
  auto x = [&](double g) { return L + (W - L - R) * (std::log2(g) / std::max(1.0, std::log2(max_gpus))); };
  auto y = [&](double ms) {
    return T + (H - T - B) * (1 - (std::log10(std::max(ms, 10.0)) - lo) / (hi - lo));
  };
  const char* colors[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e"};
  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='12'>\n"
      "<rect width='100%' height='100%' fill='white'/>\n"
      "<text x='{}' y='20' font-size='14'>Predicted stun (log scale): live pre-copy (solid) vs stop-and-copy "
      "(dashed)</text>\n",
      W, H, L);
  for (double ms = 10; ms <= max_ms * 1.5; ms *= 10) {
    svg += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#ddd'/><text x='{}' y='{:.1f}' "
                       "text-anchor='end'>{}</text>\n",
                       L, W - R, y(ms), y(ms), L - 6, y(ms) + 4, Seconds(ms));
  }
  for (const auto& c : by_link.begin()->second) {
    svg += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle'>{} GPU{}</text>\n", x(c->gpus), H - B + 18,
                       c->gpus, c->gpus == 1 ? "" : "s");
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const char* col = colors[i % 5];
    std::string live, stop;
    for (const ProjectionCell* c : by_link[order[i]]) {
      live += fmt::format("{:.1f},{:.1f} ", x(c->gpus), y(c->estimate.prediction.mid.stun_ms));
      stop += fmt::format("{:.1f},{:.1f} ", x(c->gpus), y(c->stop_and_copy_stun_ms));
    }
    svg += fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>\n", col, live);
    svg += fmt::format("<polyline fill='none' stroke='{}' stroke-dasharray='5,4' points='{}'/>\n", col, stop);
    svg += fmt::format("<text x='{}' y='{}' fill='{}'>{}</text>\n", W - R + 12, T + 20 + 18 * i, col, order[i]);
  }
  if (max_gpus >= 8) svg += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='5' fill='black'/><text x='{:.1f}' y='{:.1f}'>vMotion, "
                     "published (8 GPUs, 100 Gbit)</text>\n",
                     x(8), y(kVmotionStunMs), x(8) - 250, y(kVmotionStunMs) - 8);
  svg += "</svg>\n";
  std::ofstream f(path);
  f << svg;
  if (!f) return Status::FromErrno(errno, fmt::format("--plot: write {}", path));
  return Status::Ok();
}

}  // namespace gpumigrate::cli
