#pragma once

// The control protocol between a coordinator process and its workers: JSON text in control
// messages (hello, assign, refuse, ready, heartbeat, reset, finish, report), a queue that hands
// them from the receiver thread to the thread that acts on them, and the pieces both ends
// share. Internal to actors/ (the cluster host's two halves).

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "actors/cluster/control_schema.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/pipeline_host.h"
#include "transport/codec.h"
#include "transport/curve.h"
#include "transport/message.h"

namespace troupe::actors {

/// Control messages handed from a receiver thread to the main thread.
class control_queue {
 public:
  /// Queues `message` stamped with `received_s`, the receiving process's clock as it arrived
  /// (control_body() hands it on as "received_s"), so that the clocks of two processes can be
  /// compared without the time a message waits in this queue.
  void push(transport::message message, double received_s);
  /// The oldest message, waiting up to `seconds`; nothing on timeout.
  std::optional<transport::message> pop(double seconds);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<transport::message> messages_;
};

/// A control message: kind control with the JSON body as its text.
bool is_control(const transport::message& message);
transport::message control_message(const nlohmann::json& body);

/// The JSON body of a control message, or null when it is not JSON or control_body_problem()
/// finds fault with it (then it says so on stderr, with the sender's address when it gave
/// one, and adds 1 to `*dropped` when given). With "received_s" set to the message's arrival
/// stamp when it came through a control_queue.
nlohmann::json control_body(const transport::message& message, uint64_t* dropped = nullptr);

/// Waits for a control message whose type is in `types` (others are dropped) until `seconds`
/// pass; null on timeout.
nlohmann::json wait_for(control_queue& queue, const std::set<std::string>& types, double seconds,
                        clock_source& clock);

/// Whether a hello's secret is the run's, compared in time that does not depend on where they
/// differ.
bool same_secret(const std::string& presented, const std::string& expected);

/// Why a coordinator refuses the worker whose "hello" is `body` whatever its number of workers:
/// another protocol version, or another job (its config hash against `job_hash`); "" when it is
/// a worker of this job.
std::string hello_refusal(const nlohmann::json& body, const std::string& job_hash);

/// The stage's final report that a worker's "report" message carries: `body`, and the stage's
/// weights as the message's float32 frames.
stage_report report_from(const nlohmann::json& body, const transport::message& message);

/// With CURVE, the ZAP handler that admits only the cluster's keys; null without CURVE (or
/// with `error` set when it cannot start).
std::unique_ptr<transport::zap_authenticator> start_authenticator(
    transport::transport_context& context, const transport::security_settings& security,
    std::string* error);

/// Prints a frame the receiver could not decode, with the sender's address (when the
/// transport knows it) and the address it arrived at.
void log_dropped_frame(const std::string& address, const transport::decode_error& failure);

}  // namespace troupe::actors
