// `estimate --project-table`: the projection table as text, and as an SVG plot.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::cli {

// "1,2,4,8" -> {1,2,4,8}; "25Gbit,100Gbit" -> {"25Gbit","100Gbit"} (checked as rates).
Result<std::vector<uint32_t>> ParseGpuList(const std::string& text);
Result<std::vector<std::string>> ParseLinkList(const std::string& text);

void PrintProjectionTable(FILE* out, const ProjectionTable& t);
// Stun against GPU count, one line per link, stop-and-copy dashed, and the
// published vMotion figure marked as such.
Status WriteProjectionSvg(const ProjectionTable& t, const std::string& path);

}  // namespace gpumigrate::cli
