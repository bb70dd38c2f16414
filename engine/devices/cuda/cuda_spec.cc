#include <climits>

#include <fmt/format.h>

#include "engine/devices/device_spec.h"
#include "gpumigrate/devices/cuda.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {

std::string_view CudaHashName(CudaHash h) {
  switch (h) {
    case CudaHash::kAuto: return "auto";
    case CudaHash::kGpu: return "gpu";
    case CudaHash::kHost: return "host";
  }
  return "?";
}

std::string CudaSpec::ToString() const {
  std::string s = fmt::format("cuda:{}", pid);
  if (page_size != kCudaDefaultPageSize) s += fmt::format(",page={}", page_size);
  if (hash != CudaHash::kAuto) s += fmt::format(",hash={}", CudaHashName(hash));
  return s;
}

Result<CudaSpec> ParseCudaSpec(std::string_view text) {
  constexpr std::string_view kPrefix = "cuda:";
  auto bad = [&](std::string_view why) {
    return InvalidArgument(
        fmt::format("device '{}': {} (expected cuda:PID[,page=SIZE][,hash=auto|gpu|host])", text, why));
  };
  if (text.substr(0, kPrefix.size()) != kPrefix) return bad("not a cuda device");
  GM_ASSIGN_OR_RETURN(SplitSpec split, SplitDeviceSpec(text));
  CudaSpec spec;
  auto pid = ParseInt(split.tokens.empty() || split.tokens[0].has_value ? "" : split.tokens[0].key, 1, INT_MAX);
  if (!pid.ok()) return bad("PID must be a positive number");
  spec.pid = static_cast<int>(*pid);
  for (size_t i = 1; i < split.tokens.size(); ++i) {
    const SpecToken& token = split.tokens[i];
    if (!token.has_value) return bad(fmt::format("'{}' is not key=value", token.key));
    if (token.key == "hash") {
      if (token.value == "auto") spec.hash = CudaHash::kAuto;
      else if (token.value == "gpu") spec.hash = CudaHash::kGpu;
      else if (token.value == "host") spec.hash = CudaHash::kHost;
      else return bad(fmt::format("unknown hash '{}'", token.value));
    } else if (token.key == "page") {
      auto size = ParseSize(token.value);
      if (!size.ok()) return bad(size.status().message());
      if (*size < kCudaMinPageSize || (*size & (*size - 1)) != 0 || *size > kCudaMaxPageSize) {
        return bad(fmt::format("page must be a power of two from {} to {} (a page travels in one frame)",
                               FormatBytes(kCudaMinPageSize), FormatBytes(kCudaMaxPageSize)));
      }
      spec.page_size = static_cast<uint32_t>(*size);
    } else {
      return bad(fmt::format("unknown key '{}'", token.key));
    }
  }
  return spec;
}

ProcSpec ProcSpecForCuda(const CudaSpec& c) {
  ProcSpec p;
  p.pid = c.pid;
  p.cuda = true;
  p.cuda_page_size = c.page_size;
  p.cuda_hash = c.hash;
  return p;
}

}  // namespace gpumigrate
