#include "gpumigrate/common/prom_text.h"

#include <cmath>

#include <fmt/format.h>

namespace gpumigrate {
namespace {

bool Alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool Digit(char c) { return c >= '0' && c <= '9'; }

// Backslash and newline escaped, and the double quote where `quote` (label
// values; HELP text leaves it).
std::string Escape(std::string_view v, bool quote) {
  std::string s;
  for (char c : v) {
    if (c == '\\') {
      s += "\\\\";
    } else if (c == '\n') {
      s += "\\n";
    } else if (c == '"' && quote) {
      s += "\\\"";
    } else {
      s += c;
    }
  }
  return s;
}

}  // namespace

bool PromText::ValidName(std::string_view name) {
  if (name.empty() || !(Alpha(name[0]) || name[0] == ':')) return false;
  for (char c : name) {
    if (!(Alpha(c) || Digit(c) || c == ':')) return false;
  }
  return true;
}

bool PromText::ValidLabelName(std::string_view name) {
  if (name.empty() || !Alpha(name[0]) || name.starts_with("__")) return false;
  for (char c : name) {
    if (!(Alpha(c) || Digit(c))) return false;
  }
  return true;
}

std::string PromText::EscapeLabelValue(std::string_view v) { return Escape(v, true); }

std::string PromText::FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);  // shortest round-trip form
}

void PromText::Family(std::string_view name, std::string_view type, std::string_view help) {
  const bool type_ok = type == "gauge" || type == "counter" || type == "untyped";
  if (!ValidName(name) || !type_ok) {
    family_.clear();
    ++dropped_;
    return;
  }
  family_ = std::string(name);
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, Escape(help, false), name, type);
}

void PromText::Sample(std::string_view name, const PromLabels& labels, double value) {
  if (family_.empty() || !ValidName(name) || !name.starts_with(family_)) {
    ++dropped_;
    return;
  }
  std::string line(name);
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (!ValidLabelName(labels[i].first)) {
        ++dropped_;
        return;
      }
      if (i > 0) line += ',';
      line += fmt::format("{}=\"{}\"", labels[i].first, EscapeLabelValue(labels[i].second));
    }
    line += '}';
  }
  out_ += fmt::format("{} {}\n", line, FormatValue(value));
}

}  // namespace gpumigrate
