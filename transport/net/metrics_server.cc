#include "gpumigrate/net/metrics_server.h"

#include <httplib.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "transport/net/tcp.h"

namespace gpumigrate {
namespace {

class HttpMetricsServer final : public MetricsServer {
 public:
  HttpMetricsServer(std::unique_ptr<httplib::Server> svr, int port) : svr_(std::move(svr)), port_(port) {}
  ~HttpMetricsServer() override {
    svr_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const override { return port_; }
  uint64_t scrapes() const override { return scrapes_.load(); }

  void Serve(std::function<std::string()> render) {
    svr_->Get("/metrics", [this, render = std::move(render)](const httplib::Request&, httplib::Response& res) {
      res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
      scrapes_.fetch_add(1);
    });
    thread_ = std::thread([this] { svr_->listen_after_bind(); });
  }

 private:
  std::unique_ptr<httplib::Server> svr_;
  int port_;
  std::atomic<uint64_t> scrapes_{0};
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsServerOptions& o,
                                                            std::function<std::string()> render) {
  GM_ASSIGN_OR_RETURN(HostPort at, ParseHostPort(o.listen));
  const int given = !o.ca_file.empty() + !o.cert_file.empty() + !o.key_file.empty();
  if (given != 0 && given != 3) {
    return InvalidArgument("metrics: HTTPS needs the CA, the certificate and the key together");
  }
  std::unique_ptr<httplib::Server> svr;
  if (given == 3) {
    auto ssl = std::make_unique<httplib::SSLServer>(o.cert_file.c_str(), o.key_file.c_str(), o.ca_file.c_str());
    if (!ssl->is_valid()) {
      return InvalidArgument(fmt::format("metrics: cannot serve HTTPS with certificate {}, key {} and CA {}",
                                         o.cert_file, o.key_file, o.ca_file));
    }
    svr = std::move(ssl);
  } else {
    svr = std::make_unique<httplib::Server>();
  }
  svr->new_task_queue = [] { return new httplib::ThreadPool(2); };  // a scraper or two, not a web site
  svr->set_read_timeout(std::chrono::seconds(5));
  svr->set_write_timeout(std::chrono::seconds(5));
  int port = at.port;
  if (at.port == 0) {
    port = svr->bind_to_any_port(at.host);
  } else if (!svr->bind_to_port(at.host, at.port)) {
    port = -1;
  }
  if (port <= 0) return Unavailable(fmt::format("metrics: cannot listen on {}", o.listen));
  auto s = std::make_unique<HttpMetricsServer>(std::move(svr), port);
  s->Serve(std::move(render));
  return std::unique_ptr<MetricsServer>(std::move(s));
}

}  // namespace gpumigrate
