// The run monitor: metrics pages, the stall watch, stage activity across processes, and the
// utilization and trace windows the dashboard shows.

#include "actors/engine/run_monitor.h"

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

using json = nlohmann::json;

TEST(RunMonitorTest, MetricsComeInPagesFromAnyLine) {
  run_monitor monitor(json::object(), 1, 100);
  for (int step = 1; step <= 5; ++step) monitor.add_record({{"step", step}});
  monitor.add_record({{"event", "checkpoint"}, {"step", 5}, {"directory", "c/step-5"}});
  const json page = monitor.metrics_json(3);
  EXPECT_EQ(page["next"], 6);
  ASSERT_EQ(page["records"].size(), 3u);
  EXPECT_EQ(page["records"][0]["step"], 4);
  EXPECT_TRUE(monitor.metrics_json(6)["records"].empty());
  EXPECT_EQ(monitor.metrics_json(60)["next"], 60);
  const json summary = monitor.summary_json(110);
  EXPECT_EQ(summary["latest"]["step"], 5);  // events are not metrics
  ASSERT_EQ(summary["checkpoints"].size(), 1u);
  EXPECT_EQ(summary["checkpoints"][0]["path"], "c/step-5");
}

TEST(RunMonitorTest, TheCheckpointListCarriesTheEventsTimesAndLeavesOutWhatTheyLack) {
  run_monitor monitor(json::object(), 1, 0);
  monitor.add_record({{"event", "checkpoint"},
                      {"step", 40},
                      {"epoch", 1},
                      {"wall_s", 12.5},
                      {"bytes", 4'200'000},
                      {"seconds", 0.147},
                      {"directory", "run/checkpoints/step-40"}});
  monitor.add_record({{"event", "checkpoint"}, {"step", 80}, {"epoch", 2}, {"virtual_s", 31.0}});
  const json checkpoints = monitor.summary_json(40)["checkpoints"];
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0], json({{"step", 40},
                                  {"wall_s", 12.5},
                                  {"bytes", 4'200'000},
                                  {"seconds", 0.147},
                                  {"path", "run/checkpoints/step-40"}}));
  // A simulation's checkpoint: its virtual time, no made-up wall time, size or path.
  EXPECT_EQ(checkpoints[1], json({{"step", 80}, {"virtual_s", 31.0}}));
}

TEST(RunMonitorTest, AStallIsReportedOnceUntilTheCoordinatorHearsAgain) {
  run_monitor monitor(json::object(), 2, 0);
  EXPECT_FALSE(monitor.stall_began(100, 5));  // nothing started
  monitor.note_coordinator(10, 3);
  EXPECT_FALSE(monitor.stall_began(14.9, 5));
  EXPECT_TRUE(monitor.stall_began(15.1, 5));
  EXPECT_FALSE(monitor.stall_began(30, 5));  // once per stall
  EXPECT_EQ(monitor.summary_json(30)["state"], "running");
  monitor.status_report("stall", 30);
  EXPECT_EQ(monitor.summary_json(30)["state"], "stalled");
  monitor.note_coordinator(31, 3);
  EXPECT_TRUE(monitor.summary_json(31)["stall"].is_null());
  EXPECT_TRUE(monitor.stall_began(40, 5));
  monitor.note_coordinator(41, 0);  // nothing in flight: quiet is not stuck
  EXPECT_FALSE(monitor.stall_began(100, 5));
  monitor.note_coordinator(101, 2);
  EXPECT_FALSE(monitor.stall_began(200, 0));  // the watch is off
}

TEST(RunMonitorTest, TheReportSaysWhatEachStageHoldsAndWhereItRuns) {
  run_monitor monitor(json::object(), 2, 0);
  monitor.set_processes({{"worker pid 7 on a (stage 0)", "a", 7, {0}, 19.5},
                         {"worker pid 8 on b (stage 1)", "b", 8, {1}, 8}},
                        1);
  stage_activity zero;
  zero.keys_held = {4, 5};
  zero.mailbox = 3;
  zero.last_sent = {"forward", 5, 1, 9};
  monitor.set_activity(0, zero);
  monitor.note_received(1, {"forward", 5, 0, 9.5});
  monitor.note_coordinator(8, 2);
  const json report = monitor.status_report("stall", 20);
  EXPECT_EQ(report["silent_s"], 12);
  EXPECT_EQ(report["stages"][0]["keys_held"], json({4, 5}));
  EXPECT_EQ(report["stages"][0]["worker"], "worker pid 7 on a (stage 0)");
  EXPECT_TRUE(report["stages"][0]["working_on"].is_null());
  EXPECT_DOUBLE_EQ(report["stages"][1]["heartbeat_age_s"].get<double>(), 12);
  EXPECT_EQ(report["stages"][1]["working_on"]["key"], 5);
  EXPECT_DOUBLE_EQ(report["stages"][1]["working_on"]["age_s"].get<double>(), 10.5);
  const std::string text = describe_status(report);
  EXPECT_NE(text.find("stage 0 (worker pid 7 on a (stage 0)): holds keys 4 5"), std::string::npos)
      << text;
  EXPECT_NE(text.find("mailbox 3; last received nothing; last sent forward key 5 to stage 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stage 1 (worker pid 8 on b (stage 1), its last heartbeat 12.0 s ago): "
                      "still taking forward key 5 from stage 0 10.5 s ago"),
            std::string::npos)
      << text;
  EXPECT_EQ(monitor.summary_json(20)["restarts"], 1);
}

TEST(RunMonitorTest, HeartbeatsCarryActivityAndSpansBetweenClocks) {
  run_monitor worker(json::object(), 2, 1000);
  stage_activity activity;
  activity.version = 12;
  activity.keys_held = {30};
  activity.last_sent = {"forward", 30, 0, 1009};
  worker.set_activity(1, activity);
  worker.note_received(1, {"backward", 29, 0, 1008});
  worker.add_span(1, "forward", 29, 1002, 0.25);  // sent by an earlier heartbeat
  worker.add_span(1, "forward", 30, 1008.5, 0.25);
  const json heartbeat = worker.heartbeat_json({1}, 1005, 1010);
  ASSERT_EQ(heartbeat["spans"].size(), 1u);

  run_monitor coordinator(json({{"stages", 2}}), 2, 50);
  std::string error;
  ASSERT_TRUE(coordinator.add_heartbeat(heartbeat, {1}, 60, &error)) << error;
  const json stages = coordinator.stages_json(60);
  EXPECT_EQ(stages["stages"][1]["version"], 12);
  EXPECT_EQ(stages["stages"][1]["keys_held"], json({30}));
  EXPECT_DOUBLE_EQ(stages["stages"][1]["last_sent"]["age_s"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(stages["stages"][1]["working_on"]["age_s"].get<double>(), 2);
  const json trace = coordinator.trace_json(0, 60);
  ASSERT_EQ(trace["spans"].size(), 1u);
  EXPECT_DOUBLE_EQ(trace["spans"][0][3].get<double>(), 8.5);  // 60 − 1.5 s ago, from 50

  // A heartbeat about a stage the worker does not host, or malformed, is refused whole.
  EXPECT_FALSE(coordinator.add_heartbeat(heartbeat, {0}, 61, &error));
  EXPECT_NE(error.find("does not host"), std::string::npos) << error;
  json bad = heartbeat;
  bad["spans"][0][4] = -1;
  EXPECT_FALSE(coordinator.add_heartbeat(bad, {1}, 61, &error));
  bad = heartbeat;
  bad["activity"][0]["keys_held"] = "30";
  EXPECT_FALSE(coordinator.add_heartbeat(bad, {1}, 61, &error));
  EXPECT_NE(error.find("keys_held"), std::string::npos) << error;
  EXPECT_EQ(coordinator.stages_json(62)["stages"][1]["version"], 12);
}

TEST(RunMonitorTest, AHeartbeatCarriesTheNewestSpansOnly) {
  run_monitor worker(json::object(), 1, 0);
  const size_t spans = run_monitor::heartbeat_spans * 3;
  for (size_t i = 0; i < spans; ++i) worker.add_span(0, "forward", static_cast<int64_t>(i), i, 0.5);
  const json heartbeat = worker.heartbeat_json({0}, 0, spans + 1.0);
  ASSERT_EQ(heartbeat["spans"].size(), run_monitor::heartbeat_spans);
  EXPECT_EQ(heartbeat["spans"].back()[2], spans - 1);
  EXPECT_EQ(heartbeat["spans"].front()[2], spans - run_monitor::heartbeat_spans);
  EXPECT_LT(heartbeat.dump().size(), 32u * 1024);
}

TEST(RunMonitorTest, UtilizationIsTheBusyShareOfTheRecentWindow) {
  run_monitor monitor(json({{"stages", 2}}), 2, 0);
  for (int i = 0; i < 20; ++i) monitor.add_span(0, "forward", i, i * 1.0, 0.5);
  monitor.add_span(1, "backward", 19, 19.0, 1.0);
  const json stages = monitor.stages_json(20);
  EXPECT_DOUBLE_EQ(stages["window_s"].get<double>(), run_monitor::utilization_window_s);
  EXPECT_NEAR(stages["stages"][0]["utilization"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(stages["stages"][1]["utilization"].get<double>(), 0.1, 1e-9);
  EXPECT_NEAR(stages["stages"][0]["busy_s"].get<double>(), 10, 1e-9);
  // The trace endpoint gives the spans that ended after `since`, within its window.
  const json trace = monitor.trace_json(17.6, 20, 10);
  ASSERT_EQ(trace["spans"].size(), 3u);  // forwards 18 and 19 and the backward
  EXPECT_DOUBLE_EQ(trace["next"].get<double>(), 20);
  EXPECT_EQ(monitor.trace_json(0, 20, 3)["spans"].size(), 4u);  // ended after 17 s
}

TEST(RunMonitorTest, SpansBeyondTheCapacityPushOutTheOldest) {
  run_monitor monitor(json({{"stages", 1}}), 1, 0, 4);
  for (int i = 0; i < 10; ++i) monitor.add_span(0, "forward", i, i, 0.5);
  const json trace = monitor.trace_json(0, 10, 100);
  ASSERT_EQ(trace["spans"].size(), 4u);
  EXPECT_EQ(trace["spans"][0][2], 6);
  EXPECT_NEAR(monitor.stages_json(10)["stages"][0]["busy_s"].get<double>(), 5, 1e-9);
}

}  // namespace
}  // namespace troupe::actors
