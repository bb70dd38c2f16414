#include "gpumigrate/common/rate_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "gpumigrate/common/units.h"

namespace gpumigrate {

Result<double> ReadRateFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Unavailable(fmt::format("rate file {}: cannot read: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  if (text == "0" || text == "unlimited") return 0.0;
  auto r = ParseRateBytesPerS(text);
  if (!r.ok()) return r.status().WithContext(fmt::format("rate file {}", path));
  if (*r < 0) return InvalidArgument(fmt::format("rate file {}: a negative rate", path));
  return *r;
}

Status WriteRateFile(const std::string& path, const std::string& text) { return ReplaceFile(path, text); }

Status ReplaceFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Unavailable(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  const std::string line = text + "\n";
  const bool wrote = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!wrote) return Unavailable(fmt::format("cannot write {}", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Unavailable(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
  }
  return Status::Ok();
}

Result<std::unique_ptr<RateFile>> RateFile::Open(const std::string& path, std::chrono::milliseconds period) {
  GM_ASSIGN_OR_RETURN(double first, ReadRateFile(path));
  std::unique_ptr<RateFile> f(new RateFile(path, period));
  f->rate_.store(first);
  f->thread_ = std::thread([p = f.get()] { p->Run(); });
  return f;
}

RateFile::~RateFile() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RateFile::Run() {
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, period_, [&] { return stop_; })) {
    lk.unlock();
    auto r = ReadRateFile(path_);
    if (r.ok() && *r != rate_.load()) {
      rate_.store(*r);
      ++changes_;
    }
    lk.lock();
  }
}

}  // namespace gpumigrate
