#include "apps/dashboard/dashboard_server.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <httplib.h>

/// The page, apps/dashboard/index.html, built into the program (cmake/embed_text.cmake).
const char* troupe_dashboard_page();

namespace troupe::apps {
namespace {

/// Where Debian's libjs-chart.js puts Chart.js (3.x, then 4.x).
const char* const chart_script_paths[] = {"/usr/share/javascript/chart.js/chart.min.js",
                                          "/usr/share/javascript/chart.js/chart.umd.js"};

bool loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr address{};
  return inet_pton(AF_INET, host.c_str(), &address) == 1 && (ntohl(address.s_addr) >> 24) == 127;
}

/// The whole text of the file at `path`; empty when it cannot be read.
std::string file_text(const char* path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  if (file) text << file.rdbuf();
  return text.str();
}

void send_json(httplib::Response& response, const nlohmann::json& value) {
  response.set_header("Cache-Control", "no-store");
  response.set_content(value.dump(), "application/json");
}

/// A query parameter as a number; `fallback` when absent or not a number.
double number_parameter(const httplib::Request& request, const char* name, double fallback) {
  if (!request.has_param(name)) return fallback;
  const std::string text = request.get_param_value(name);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' && value >= 0 ? value : fallback;
}

}  // namespace

std::optional<dashboard_address> parse_dashboard_address(const std::string& text,
                                                         const std::string& token,
                                                         std::string* error, const char* option) {
  dashboard_address address;
  std::string port = text;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    address.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (address.host.size() > 2 && address.host.front() == '[' && address.host.back() == ']')
      address.host = address.host.substr(1, address.host.size() - 2);
  }
  if (!port.empty()) {
    char* end = nullptr;
    const long value = std::strtol(port.c_str(), &end, 10);
    if (end == port.c_str() || *end != '\0' || value < 0 || value > 65535 || address.host.empty()) {
      *error = std::string(option) + " " + text + ": not HOST:PORT (e.g. 127.0.0.1:8265)";
      return std::nullopt;
    }
    address.port = static_cast<int>(value);
  }
  if (!loopback(address.host) && token.empty()) {
    *error = std::string(option) + " " + text + ": " + address.host +
             " is not a loopback address; serving it needs --dashboard-token";
    return std::nullopt;
  }
  return address;
}

dashboard_server::dashboard_server(std::function<dashboard_view()> view, std::string token)
    : view_(std::move(view)), token_(std::move(token)) {
  for (const char* path : chart_script_paths) {
    chart_script_ = file_text(path);
    if (!chart_script_.empty()) break;
  }
}

dashboard_server::~dashboard_server() { stop(); }

void dashboard_server::add_routes() {
  httplib::Server& server = *server_;
  server.set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (token_.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string bearer = request.get_header_value("Authorization");
        if ((request.has_param("token") && request.get_param_value("token") == token_) ||
            bearer == "Bearer " + token_) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        response.status = 401;
        response.set_content("this dashboard needs its token: add ?token=TOKEN to the address\n",
                             "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      });
  server.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(troupe_dashboard_page(), "text/html; charset=utf-8");
  });
  server.Get("/chart.js", [this](const httplib::Request&, httplib::Response& response) {
    if (chart_script_.empty()) {
      response.status = 404;
      response.set_content("Chart.js is missing: apt-get install libjs-chart.js\n", "text/plain");
      return;
    }
    response.set_header("Cache-Control", "max-age=3600");
    response.set_content(chart_script_, "application/javascript");
  });
  server.Get("/api/summary", [this](const httplib::Request&, httplib::Response& response) {
    const dashboard_view view = view_();
    send_json(response, view.monitor->summary_json(view.now_s));
  });
  server.Get("/api/metrics", [this](const httplib::Request& request, httplib::Response& response) {
    const dashboard_view view = view_();
    send_json(response, view.monitor->metrics_json(
                            static_cast<size_t>(number_parameter(request, "since", 0))));
  });
  server.Get("/api/stages", [this](const httplib::Request&, httplib::Response& response) {
    const dashboard_view view = view_();
    send_json(response, view.monitor->stages_json(view.now_s));
  });
  server.Get("/api/trace", [this](const httplib::Request& request, httplib::Response& response) {
    const dashboard_view view = view_();
    send_json(response,
              view.monitor->trace_json(number_parameter(request, "since", 0), view.now_s));
  });
}

bool dashboard_server::start(const dashboard_address& address, std::string* error) {
  server_ = std::make_unique<httplib::Server>();
  // A few threads: each open page keeps a connection; an idle one is let go after a second.
  server_->new_task_queue = [] { return new httplib::ThreadPool(4); };
  server_->set_keep_alive_timeout(1);
  add_routes();
  const std::string where = address.host + ":" + std::to_string(address.port);
  if (address.port == 0) {
    port_ = server_->bind_to_any_port(address.host);
    if (port_ <= 0) {
      *error = "the dashboard cannot listen on " + where;
      return false;
    }
  } else {
    if (!server_->bind_to_port(address.host, address.port)) {
      *error = "the dashboard cannot listen on " + where + " (in use, or not this machine's)";
      return false;
    }
    port_ = address.port;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return true;
}

void dashboard_server::stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace troupe::apps
