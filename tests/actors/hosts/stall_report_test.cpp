// A pipeline that stops moving says why: a stage stalled on purpose (the fault hook holds it in
// the middle of a message) is named in the stall report, with the key it is stuck on and the
// keys the others hold, once the coordinator has heard nothing for metrics.stall_timeout_s; the
// run goes on once it is let go.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "actors/config/job_data.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/pipeline_test_seam.h"
#include "tests/support/engine_helpers.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

using clock_type = std::chrono::steady_clock;

/// Holds stage `actor` when it takes the forward pass of `key`, until released.
class stage_stall {
 public:
  stage_stall(int actor, int64_t key) : actor_(actor), key_(key) {}

  void operator()(int actor, const message_note& message) {
    if (actor != actor_ || message.kind != "forward" || message.key != key_) return;
    std::unique_lock<std::mutex> lock(mutex_);
    stalled_at_ = clock_type::now();
    released_.wait_for(lock, std::chrono::seconds(60), [this] { return released_flag_; });
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_flag_ = true;
    released_.notify_all();
  }

  std::optional<clock_type::time_point> stalled_at() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stalled_at_;
  }

 private:
  const int actor_;
  const int64_t key_;
  std::mutex mutex_;
  std::condition_variable released_;
  bool released_flag_ = false;
  std::optional<clock_type::time_point> stalled_at_;
};

/// Keeps the first stall report that shows the stall on purpose, and then lets the stage go.
class stall_observer final : public training_observer {
 public:
  explicit stall_observer(stage_stall& stall) : stall_(stall) {}
  void on_step(int64_t, int64_t, int64_t, double, double) override {}
  void on_metrics(const metrics_record&) override {}
  void on_event(const nlohmann::json& event) override {
    if (event.value("event", std::string()) != "stall" || report_) return;
    if (!stall_.stalled_at()) return;  // a slow moment before the stall on purpose
    report_ = event;
    stall_.release();
  }
  std::optional<nlohmann::json> report_;

 private:
  stage_stall& stall_;
};

/// One epoch of a small async pipeline of `stages` stages, one thread each.
job_config stall_job(int stages, double stall_timeout_s) {
  job_config config =
      testing::small_pipeline_job(stages, 1, pipeline_mode::async, pipeline_schedule::gpipe, 800);
  config.training.epochs = 1;
  config.parallelism.threads = stages;
  config.metrics.stall_timeout_s = stall_timeout_s;
  return config;
}

TEST(StallReportTest, NamesTheStalledStageAndItsKeysOnceTheTimeoutPasses) {
  job_config config = stall_job(3, 1);
  config.parallelism.max_active_keys = 4;
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  run_monitor monitor(nlohmann::json::object(), 3, 0);
  stage_stall stall(1, 6);
  stall_observer observer(stall);
  testing::wall_clock clock;
  pipeline_options options;
  options.monitor = &monitor;
  const stage_message_hook hook = [&stall](int actor, const message_note& message) {
    stall(actor, message);
  };
  ASSERT_TRUE(run_pipeline_with_hook(config, *data, observer, clock, options, hook, &error))
      << error;
  stall.release();  // should the report not have come, the run still ends

  ASSERT_TRUE(observer.report_) << "no stall report";
  // Reported because the coordinator had heard nothing for the timeout, as the report says.
  EXPECT_GE((*observer.report_)["silent_s"].get<double>(), config.metrics.stall_timeout_s)
      << observer.report_->dump();
  const nlohmann::json& stages = (*observer.report_)["stages"];
  ASSERT_EQ(stages.size(), 3u);
  // Stage 1 is named as stuck on the forward pass of key 6, and only stage 1.
  for (int actor = 0; actor < 3; ++actor) {
    const nlohmann::json& working = stages[actor]["working_on"];
    if (actor != 1) {
      EXPECT_TRUE(working.is_null()) << stages[actor].dump();
      continue;
    }
    ASSERT_TRUE(working.is_object()) << stages[actor].dump();
    EXPECT_EQ(working["kind"], "forward");
    EXPECT_EQ(working["key"], 6);
    EXPECT_EQ(working["peer"], 0);
    EXPECT_GT(working["age_s"].get<double>(), 0.0);
  }
  // Stage 0 ran the forward passes of the keys in flight, 6 among them, and waits for their
  // backward passes; their messages queue at stage 1.
  std::vector<int64_t> held = stages[0]["keys_held"];
  EXPECT_NE(std::find(held.begin(), held.end(), 6), held.end()) << stages[0].dump();
  EXPECT_EQ(stages[0]["worker"], "this process");
  EXPECT_GE((*observer.report_)["keys_in_flight"].get<int64_t>(), 1);
  // The log line names the stage and the key.
  const std::string text = describe_status(*observer.report_);
  EXPECT_NE(text.find("stage 1 (this process): still taking forward key 6 from stage 0"),
            std::string::npos)
      << text;
}

TEST(StallReportTest, AStatusReportOnRequestAndNoStallWhileTheRunMoves) {
  const job_config config = stall_job(2, 30);
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  run_monitor monitor(nlohmann::json::object(), 2, 0);
  std::atomic<bool> asked{false};
  // Stage 0 asks for a report as it takes key 4 (as SIGUSR2 would) and waits for it.
  stage_stall stall(0, 4);
  struct recorder final : training_observer {
    explicit recorder(stage_stall& stall) : stall(stall) {}
    void on_step(int64_t, int64_t, int64_t, double, double) override {}
    void on_metrics(const metrics_record&) override {}
    void on_event(const nlohmann::json& event) override {
      events.push_back(event);
      if (event.value("event", std::string()) == "status") stall.release();
    }
    stage_stall& stall;
    std::vector<nlohmann::json> events;
  } observer(stall);
  testing::wall_clock clock;
  pipeline_options options;
  options.monitor = &monitor;
  options.status_requests = &asked;
  const stage_message_hook hook = [&](int actor, const message_note& message) {
    if (actor == 0 && message.kind == "forward" && message.key == 4) asked = true;
    stall(actor, message);
  };
  ASSERT_TRUE(run_pipeline_with_hook(config, *data, observer, clock, options, hook, &error))
      << error;
  stall.release();
  int status = 0, stalls = 0;
  for (const nlohmann::json& event : observer.events) {
    const std::string kind = event.value("event", std::string());
    status += kind == "status";
    stalls += kind == "stall";
    if (kind == "status") {
      ASSERT_EQ(event["stages"].size(), 2u);
      EXPECT_EQ(event["stages"][0]["working_on"]["key"], 4) << event.dump();
    }
  }
  EXPECT_EQ(status, 1);
  EXPECT_EQ(stalls, 0);
  EXPECT_FALSE(asked);
}

}  // namespace
}  // namespace troupe::actors
