#pragma once

// The dashboard: an HTTP server (cpp-httplib) on its own thread that serves a page with live
// charts (Chart.js from Debian's libjs-chart.js, served from this machine) and JSON endpoints
// for scripts, all read from a run_monitor. Read-only; loopback only unless a token is set.
// docs/guide/dashboard.md describes the endpoints.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "actors/engine/run_monitor.h"

namespace httplib {
class Server;
}

namespace troupe::apps {

struct dashboard_address {
  std::string host = "127.0.0.1";
  int port = 8265;
};

/// "HOST:PORT", "PORT" or "" (the default, 127.0.0.1:8265). Nothing, with `error` set, when
/// malformed; a host that is not a loopback address needs a token (`token` empty: refused).
/// `option` names the option in messages.
std::optional<dashboard_address> parse_dashboard_address(const std::string& text,
                                                         const std::string& token,
                                                         std::string* error,
                                                         const char* option = "--dashboard");

/// What the dashboard shows: the monitor, and the time (on the monitor's clock) to show it at.
struct dashboard_view {
  std::shared_ptr<const actors::run_monitor> monitor;
  double now_s = 0;
};

class dashboard_server {
 public:
  /// `view` is called for every request, on the server's threads.
  dashboard_server(std::function<dashboard_view()> view, std::string token);
  ~dashboard_server();
  dashboard_server(const dashboard_server&) = delete;
  dashboard_server& operator=(const dashboard_server&) = delete;

  /// Binds `address` (port 0: any free port) and serves on a thread of its own. False, with
  /// `error` naming the address, when it cannot bind.
  bool start(const dashboard_address& address, std::string* error);
  /// The port it listens on (after start()).
  int port() const { return port_; }
  /// Stops serving; waits for the thread.
  void stop();

 private:
  void add_routes();

  std::function<dashboard_view()> view_;
  std::string token_;
  std::string chart_script_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace troupe::apps
