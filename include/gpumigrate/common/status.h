// Status and Result<T>: how every layer below the CLI reports failure.
//
// No exceptions cross the engine, transport or codec. A Status is either OK or
// an error code plus a message that reads "<component>: <action> failed: <cause>".
// Status::FromErrno builds one straight from -errno (or errno) with that context.
// Both types are cheap to move and [[nodiscard]]: ignoring one is a compile error
// under -Werror.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gpumigrate {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input from a user or a peer (usage, spec, frame)
  kCorrupt,           // data failed an integrity, bounds or sequence check
  kUnavailable,       // peer gone, connection cut, stream closed
  kFailedPrecondition,// wrong lifecycle state for the call
  kAborted,           // the migration was aborted (by policy, a fault or the user)
  kInDoubt,           // commit sent but not confirmed: both sides stopped
  kDeadlineExceeded,
  kResourceExhausted,
  kUnimplemented,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // errno_value may be negative (as io_uring and ioctl wrappers return it).
  static Status FromErrno(int errno_value, std::string_view context);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The errno a FromErrno status was made from (0: none), kept by WithContext
  // and by every copy: for a caller that acts on the system's reason
  // (ECONNREFUSED: nobody listens there), never on the words of the message.
  int error_number() const { return errno_; }
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>" (adds the phase or layer).
  Status WithContext(std::string_view prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int errno_ = 0;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {      // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpumigrate

#define GM_CONCAT_INNER(a, b) a##b
#define GM_CONCAT(a, b) GM_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is an error. The
// temporary has a name of its own (__COUNTER__), so the macro may nest: a lambda
// in `expr` that uses it again does not shadow the outer one (-Wshadow).
#define GM_RETURN_IF_ERROR(expr) GM_RETURN_IF_ERROR_IMPL(GM_CONCAT(gm_status_, __COUNTER__), expr)
#define GM_RETURN_IF_ERROR_IMPL(tmp, expr) \
  do {                                     \
    ::gpumigrate::Status tmp = (expr);     \
    if (!tmp.ok()) return tmp;             \
  } while (0)

// `GM_ASSIGN_OR_RETURN(auto x, MakeX());`
#define GM_ASSIGN_OR_RETURN(lhs, expr) GM_ASSIGN_OR_RETURN_IMPL(GM_CONCAT(gm_result_, __LINE__), lhs, expr)
#define GM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
