// Printing for the CLI that never throws: fmt::print throws std::system_error
// when a write fails, and a reader of stdout or stderr that went away (`| head`,
// a log shipper that died) makes every write fail with EPIPE (SIGPIPE is
// ignored, main.cc). Losing our own output must not abort a migration mid-way
// or turn its exit code into a crash (issue 19), so what cannot be written is
// dropped.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace gpumigrate::cli {

template <typename... T>
void Print(FILE* out, fmt::format_string<T...> format, T&&... args) {
  std::string text = fmt::format(format, std::forward<T>(args)...);
  std::fwrite(text.data(), 1, text.size(), out);
}

template <typename... T>
void Print(fmt::format_string<T...> format, T&&... args) {
  Print(stdout, format, std::forward<T>(args)...);
}

}  // namespace gpumigrate::cli
