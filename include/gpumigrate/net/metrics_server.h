// A Prometheus scrape endpoint: GET /metrics answered with what `render`
// returns (text exposition format 0.0.4), on its own thread. Plain HTTP, or
// HTTPS that requires a client certificate signed by `tls.ca_file` (the
// agent's mutual TLS, for a Prometheus given a client certificate). Anything
// but GET /metrics is 404. Built on cpp-httplib.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct MetricsServerOptions {
  std::string listen;  // "ADDR:PORT"; port 0: any free port (see port())
  // All three set: HTTPS with client certificates; all empty: plain HTTP.
  std::string ca_file, cert_file, key_file;
};

class MetricsServer {
 public:
  static Result<std::unique_ptr<MetricsServer>> Start(const MetricsServerOptions& options,
                                                      std::function<std::string()> render);
  virtual ~MetricsServer() = default;  // stops serving and joins its thread
  virtual int port() const = 0;
  virtual uint64_t scrapes() const = 0;  // GET /metrics answered so far
};

}  // namespace gpumigrate
