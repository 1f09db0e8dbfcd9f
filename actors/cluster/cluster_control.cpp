#include "actors/cluster/cluster_control.h"

#include <cstdio>

#include "actors/config/json_text.h"

namespace troupe::actors {

using json = nlohmann::json;

namespace {

/// Who sent `body`, as far as it says.
std::string sender_of(const json& body) {
  const auto address = body.is_object() ? body.find("address") : body.end();
  if (body.is_object() && address != body.end() && address->is_string())
    return address->get<std::string>().substr(0, 200);
  return "a peer that gave no address";
}

}  // namespace

void control_queue::push(transport::message message, double received_s) {
  message.header.metrics["received_s"] = received_s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.push_back(std::move(message));
  }
  ready_.notify_one();
}

std::optional<transport::message> control_queue::pop(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, seconds)),
                       [&] { return !messages_.empty(); })) {
    return std::nullopt;
  }
  transport::message message = std::move(messages_.front());
  messages_.pop_front();
  return message;
}

bool is_control(const transport::message& message) {
  return message.header.kind == transport::message_kind::control && !message.header.text.empty();
}

transport::message control_message(const json& body) {
  transport::message message;
  message.header.kind = transport::message_kind::control;
  message.header.text = body.dump();
  return message;
}

json control_body(const transport::message& message, uint64_t* dropped) {
  std::string problem;
  json body = parse_json_text(message.header.text, &problem).value_or(json());
  if (problem.empty()) problem = control_body_problem(body);
  if (!problem.empty()) {
    std::fprintf(stderr, "troupe: dropped a control message from %s: %s\n", sender_of(body).c_str(),
                 problem.c_str());
    if (dropped) ++*dropped;
    return json();
  }
  auto received = message.header.metrics.find("received_s");
  if (received != message.header.metrics.end()) body["received_s"] = received->second;
  return body;
}

json wait_for(control_queue& queue, const std::set<std::string>& types, double seconds,
              clock_source& clock) {
  const double deadline = clock.now_seconds() + seconds;
  for (double left = seconds; left > 0; left = deadline - clock.now_seconds()) {
    auto message = queue.pop(left);
    if (!message) break;
    json body = control_body(*message);
    if (!body.is_null() && types.count(body["type"].get<std::string>())) return body;
  }
  return json();
}

std::unique_ptr<transport::zap_authenticator> start_authenticator(
    transport::transport_context& context, const transport::security_settings& security,
    std::string* error) {
  if (!security.curve) return nullptr;
  return transport::zap_authenticator::start(context, error);
}

void log_dropped_frame(const std::string& address, const transport::decode_error& failure) {
  if (failure.peer.empty()) {
    std::fprintf(stderr, "troupe: dropped a frame at %s: %s\n", address.c_str(),
                 failure.text.c_str());
  } else {
    std::fprintf(stderr, "troupe: dropped a frame from %s at %s: %s\n", failure.peer.c_str(),
                 address.c_str(), failure.text.c_str());
  }
}

bool same_secret(const std::string& presented, const std::string& expected) {
  unsigned char difference = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference |=
        static_cast<unsigned char>(expected[i] ^ (i < presented.size() ? presented[i] : 0));
  }
  return difference == 0;
}

std::string hello_refusal(const nlohmann::json& body, const std::string& job_hash) {
  const int protocol = body.value("protocol", 0);
  const std::string theirs = body.value("job_hash", std::string());
  if (protocol != transport::current_protocol_version) {
    return "it speaks protocol version " + std::to_string(protocol) + ", this coordinator speaks " +
           std::to_string(transport::current_protocol_version);
  }
  if (!theirs.empty() && theirs != job_hash) {
    return "it was started for another job (config hash " + theirs + ", this job's is " + job_hash +
           ")";
  }
  return "";
}

stage_report report_from(const nlohmann::json& body, const transport::message& message) {
  stage_report report;
  report.version = body.value("version", int64_t{0});
  report.peak_contexts = body.value("peak_contexts", size_t{0});
  report.peak_activation_bytes = body.value("peak_activation_bytes", int64_t{0});
  report.staleness_histogram = body.value("staleness", std::vector<int64_t>{});
  report.weight_staleness_histogram = body.value("weight_staleness", std::vector<int64_t>{});
  report.replica_staleness_histogram = body.value("replica_staleness", std::vector<int64_t>{});
  for (const transport::frame& frame : message.payloads) {
    const auto* begin = static_cast<const float*>(frame.data);
    report.weights.emplace_back(begin, begin + frame.bytes / sizeof(float));
  }
  return report;
}

}  // namespace troupe::actors
