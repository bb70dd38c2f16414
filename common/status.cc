#include "gpumigrate/common/status.h"

#include <cstring>
#include <cstdlib>

#include <fmt/format.h>

namespace gpumigrate {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kCorrupt: return "CORRUPT";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kInDoubt: return "IN_DOUBT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status Status::FromErrno(int errno_value, std::string_view context) {
  int e = std::abs(errno_value);
  StatusCode code = StatusCode::kInternal;
  switch (e) {
    case EINVAL: case E2BIG: case ERANGE: code = StatusCode::kInvalidArgument; break;
    case EPIPE: case ECONNRESET: case ECONNREFUSED: case ENOTCONN: case ESHUTDOWN:
    case ESRCH: code = StatusCode::kUnavailable; break;
    case ENOMEM: case ENOSPC: case EMFILE: case ENFILE: code = StatusCode::kResourceExhausted; break;
    case ETIMEDOUT: code = StatusCode::kDeadlineExceeded; break;
    case ENOSYS: case EOPNOTSUPP: code = StatusCode::kUnimplemented; break;
    case EPERM: case EACCES: case EBUSY: code = StatusCode::kFailedPrecondition; break;
    default: break;
  }
  Status s(code, fmt::format("{}: {} (errno {})", context, std::strerror(e), e));
  s.errno_ = e;
  return s;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", StatusCodeName(code_), message_);
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  Status s(code_, fmt::format("{}: {}", prefix, message_));
  s.errno_ = errno_;
  return s;
}

}  // namespace gpumigrate
