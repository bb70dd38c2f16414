// The agent's control-channel framing: a 4-byte big-endian length, then one
// JSON object. A length over the limit is refused before anything is read into
// memory, so a peer cannot make the agent allocate what it announces.
#include <array>

#include <fmt/format.h>

#include "gpumigrate/agent/agent.h"

namespace gpumigrate::agent {

Status WriteMessage(Stream& s, const Json& message) {
  const std::string body = message.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (body.size() > kMaxMessageBytes) {
    return InvalidArgument(fmt::format("message of {} bytes is over the limit of {}", body.size(), kMaxMessageBytes));
  }
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::array<std::byte, 4> len{std::byte(n >> 24), std::byte(n >> 16), std::byte(n >> 8), std::byte(n)};
  GM_RETURN_IF_ERROR(s.WriteAll(len));
  return s.WriteAll(std::as_bytes(std::span(body.data(), body.size())));
}

namespace {

// Deepest nesting of arrays and objects in JSON text, strings skipped: the
// parser and every copy recurse, so a deep message would exhaust the stack.
constexpr int kMaxDepth = 64;
bool TooDeep(const std::string& t) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

Result<Json> ReadMessage(Stream& s) {
  std::array<std::byte, 4> len{};
  GM_RETURN_IF_ERROR(s.ReadExact(len));
  const uint32_t n = (uint32_t(len[0]) << 24) | (uint32_t(len[1]) << 16) | (uint32_t(len[2]) << 8) | uint32_t(len[3]);
  if (n > kMaxMessageBytes) {
    return Corrupt(fmt::format("{}: message length {} is over the limit of {}", s.Name(), n, kMaxMessageBytes));
  }
  std::string body(n, '\0');
  if (Status st = s.ReadExact(std::as_writable_bytes(std::span(body.data(), body.size()))); !st.ok()) {
    return Corrupt(fmt::format("{}: message cut off within its {} bytes: {}", s.Name(), n, st.message()));
  }
  if (TooDeep(body)) {
    return Corrupt(fmt::format("{}: a message nested deeper than {} levels", s.Name(), kMaxDepth));
  }
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Corrupt(fmt::format("{}: a message of {} bytes that is not a JSON object", s.Name(), n));
  }
  return j;
}

}  // namespace gpumigrate::agent
