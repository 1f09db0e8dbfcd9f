#pragma once

// A coordinator and its workers on threads of one test process, talking over ipc:// as they do
// between processes: the job they run (tests/cluster/three_stage_job.toml, which the
// multi-host test runs too), the in-process run a cluster run must equal, and the workers.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/cluster/cluster_control.h"
#include "actors/cluster/cluster_host.h"
#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/hosts/pipeline_host.h"
#include "tests/support/engine_helpers.h"
#include "transport/endpoint.h"

namespace troupe::actors {

using testing::wall_clock;

/// tests/cluster/three_stage_job.toml, which the multi-host test runs too.
inline const std::string job_toml = [] {
  std::ifstream file(TROUPE_SOURCE_DIR "/tests/cluster/three_stage_job.toml");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}();

inline std::vector<std::vector<float>> weights_of(const pipeline_report& report) {
  std::vector<std::vector<float>> result;
  for (const auto& stage : report.stages) {
    for (const auto& w : stage.weights) result.push_back(w);
  }
  return result;
}

/// The job with `overrides`, its data and its run in one process: what a cluster run of it
/// must equal.
struct reference_run {
  std::optional<job_config> config;
  std::optional<job_data> data;
  std::optional<pipeline_report> local;
};

/// The job with `overrides` and its data, without the reference run.
inline void load_job(const std::vector<std::string>& overrides, reference_run* out) {
  job_error problem;
  out->config = parse_job(job_toml, "cluster test", overrides, &problem);
  ASSERT_TRUE(out->config) << problem.message;
  std::string error;
  out->data = load_job_data(*out->config, &error);
  ASSERT_TRUE(out->data) << error;
}

inline void run_reference(const std::vector<std::string>& overrides, reference_run* out) {
  ASSERT_NO_FATAL_FAILURE(load_job(overrides, out));
  std::string error;
  wall_clock clock;
  quiet_observer observer;
  pipeline_options collect;
  collect.collect_weights = true;
  out->local = run_pipeline(*out->config, *out->data, observer, clock, collect, &error);
  ASSERT_TRUE(out->local) << error;
}

/// A coordinator of the job with `overrides` for `workers` workers, listening in `directory`.
inline coordinator_options coordinator_in(const std::string& directory, int workers,
                                          const std::vector<std::string>& overrides = {}) {
  coordinator_options options;
  options.listen_address = "ipc://" + directory + "/coordinator";
  options.workers = workers;
  options.job_toml = job_toml;
  options.overrides = overrides;
  return options;
}

/// A fresh directory for a test's ipc:// sockets (the caller removes it).
inline std::string fresh_socket_directory() {
  char pattern[] = "/tmp/troupe-test-XXXXXX";
  const char* made = mkdtemp(pattern);
  return made ? made : "/tmp";
}

/// A coordinator of `job` on a thread of its own, as `troupe coordinator` runs in a process of
/// its own; join() waits for its run to end and gives its report.
class coordinator_thread {
 public:
  coordinator_thread(const reference_run& job, coordinator_options options)
      : options_(std::move(options)), thread_([this, &job] {
          wall_clock clock;
          quiet_observer observer;
          report_ = run_coordinator(*job.config, *job.data, options_, observer, clock, &error_);
        }) {}
  ~coordinator_thread() {
    if (thread_.joinable()) thread_.join();
  }
  coordinator_thread(const coordinator_thread&) = delete;
  coordinator_thread& operator=(const coordinator_thread&) = delete;

  /// The run's report; nothing, with `error` set, when the run failed.
  std::optional<pipeline_report> join(std::string* error) {
    if (thread_.joinable()) thread_.join();
    *error = error_;
    return report_;
  }

 private:
  coordinator_options options_;
  std::optional<pipeline_report> report_;
  std::string error_;
  std::thread thread_;
};

/// A host whose monotonic clock started long before the coordinator's.
class shifted_clock final : public clock_source {
 public:
  explicit shifted_clock(double shift_s) : shift_s_(shift_s) {}
  double now_seconds() override { return base_.now_seconds() + shift_s_; }

 private:
  wall_clock base_;
  double shift_s_;
};

/// Runs a worker at `address` for the coordinator at `coordinator` on a thread of its own, its
/// clock `clock_shift_s` from this one's (another host's), leaving its exit status and error in
/// `status` and `error`.
inline std::thread start_worker(const std::string& coordinator, const std::string& address,
                                int* status, std::string* error, double clock_shift_s = 0) {
  return std::thread([coordinator, address, status, error, clock_shift_s] {
    worker_options settings;
    settings.coordinator_address = coordinator;
    settings.listen_address = address;
    shifted_clock worker_clock(clock_shift_s);
    *status = run_worker(settings, worker_clock, error);
  });
}

/// Runs a worker at `address` for the coordinator at `coordinator` on this thread until its run
/// ends; its exit status, with `error` set on failure.
inline int run_worker_at(const std::string& coordinator, const std::string& address,
                         std::string* error) {
  worker_options settings;
  settings.coordinator_address = coordinator;
  settings.listen_address = address;
  wall_clock clock;
  return run_worker(settings, clock, error);
}

/// One worker per entry of `clock_shifts_s` at DIRECTORY/worker-W, each started as
/// start_worker() does with that clock shift; statuses and errors by worker.
inline std::vector<std::thread> start_workers(const std::string& coordinator,
                                              const std::string& directory,
                                              const std::vector<double>& clock_shifts_s,
                                              std::vector<int>* statuses,
                                              std::vector<std::string>* errors) {
  std::vector<std::thread> workers;
  for (size_t w = 0; w < clock_shifts_s.size(); ++w) {
    workers.push_back(start_worker(coordinator,
                                   "ipc://" + directory + "/worker-" + std::to_string(w),
                                   &(*statuses)[w], &(*errors)[w], clock_shifts_s[w]));
  }
  return workers;
}

/// Sends each text as a control message to `address`, returning once they have left.
inline void send_control_texts(transport::transport_context& context, const std::string& address,
                               const std::vector<std::string>& texts) {
  transport::endpoint_options lingering;
  lingering.linger_ms = 10000;  // closing waits for the messages to leave
  auto out = transport::outbox::connect(context, address, lingering, nullptr);
  ASSERT_TRUE(out);
  for (const std::string& text : texts) {
    transport::message message;
    message.header.kind = transport::message_kind::control;
    message.header.text = text;
    const transport::send_result sent = out->send_waiting(message, std::chrono::seconds(10));
    ASSERT_TRUE(sent.ok()) << sent.detail;
  }
}

/// Calls `action` once, on the coordinator's thread, when the run reaches `step`.
class at_step final : public training_observer {
 public:
  at_step(int64_t step, std::function<void()> action) : step_(step), action_(std::move(action)) {}
  void on_step(int64_t step, int64_t, int64_t, double, double) override {
    if (step < step_ || done_) return;
    done_ = true;
    action_();
  }
  void on_metrics(const metrics_record&) override {}
  bool done() const { return done_; }

 private:
  int64_t step_;
  std::function<void()> action_;
  bool done_ = false;
};

}  // namespace troupe::actors
