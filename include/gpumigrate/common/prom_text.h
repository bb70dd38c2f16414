// Prometheus' text exposition format (version 0.0.4), written: what an agent
// serves on /metrics. One family at a time: Family() writes its # HELP and
// # TYPE lines, Sample() its series. Names and label names are checked against
// the format's grammar (a bad one is a programming error: the sample is
// dropped and counted in dropped()); label values are escaped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpumigrate {

using PromLabels = std::vector<std::pair<std::string, std::string>>;

class PromText {
 public:
  // type: "gauge", "counter" (name ends in _total), "untyped".
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // A series of the current family (name may carry a suffix of it, e.g. _info).
  void Sample(std::string_view name, const PromLabels& labels, double value);
  const std::string& text() const { return out_; }
  int dropped() const { return dropped_; }

  static bool ValidName(std::string_view name);       // [a-zA-Z_:][a-zA-Z0-9_:]*
  static bool ValidLabelName(std::string_view name);  // [a-zA-Z_][a-zA-Z0-9_]*, not __*
  static std::string EscapeLabelValue(std::string_view v);  // \ " and newline
  static std::string FormatValue(double v);  // integers exactly, NaN, +Inf, -Inf

 private:
  std::string out_;
  std::string family_;
  int dropped_ = 0;
};

}  // namespace gpumigrate
