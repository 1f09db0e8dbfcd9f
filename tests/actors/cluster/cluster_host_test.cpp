// The coordinator and workers as they run in separate processes, here on threads of one test
// process talking over ipc:// (the same sockets and frames): the stages' final weights equal
// the in-process engine's bit for bit in sync mode.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "actors/cluster/cluster_control.h"
#include "actors/cluster/cluster_host.h"
#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/trace_recorder.h"
#include "actors/hosts/pipeline_host.h"
#include "tests/support/cluster_helpers.h"
#include "tests/support/engine_helpers.h"
#include "tests/support/job_helpers.h"
#include "tests/support/polling.h"
#include "transport/endpoint.h"

namespace troupe::actors {
namespace {

using actors::quiet_observer;
using testing::wall_clock;

TEST(ClusterHostTest, WorkersOverIpcEqualTheInProcessEngineBitForBit) {
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    const std::vector<std::string> overrides = {std::string("parallelism.schedule=") +
                                                to_string(schedule)};
    reference_run reference;
    ASSERT_NO_FATAL_FAILURE(run_reference(overrides, &reference));
    const pipeline_report& local = *reference.local;
    wall_clock clock;
    quiet_observer observer;
    std::string error;

    char pattern[] = "/tmp/troupe-test-XXXXXX";
    const std::string directory = mkdtemp(pattern);
    const coordinator_options options = coordinator_in(directory, 2, overrides);
    std::vector<int> statuses(2, -1);
    std::vector<std::string> errors(2);
    std::vector<std::thread> workers =
        start_workers(options.listen_address, directory, {0.0, 0.0}, &statuses, &errors);
    auto remote =
        run_coordinator(*reference.config, *reference.data, options, observer, clock, &error);
    for (auto& worker : workers) worker.join();
    std::filesystem::remove_all(directory);
    ASSERT_TRUE(remote) << error;
    EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
    ASSERT_EQ(remote->stages.size(), 3u);
    EXPECT_EQ(weights_of(*remote), weights_of(local)) << to_string(schedule);
    EXPECT_EQ(remote->summary.final_test_loss, local.summary.final_test_loss);
    EXPECT_EQ(remote->summary.steps, 80);
  }
}

TEST(ClusterHostTest, WorkersDropForeignMessagesAndKeepTraining) {
  reference_run reference;
  ASSERT_NO_FATAL_FAILURE(run_reference({}, &reference));
  const job_config& config = *reference.config;
  char pattern[] = "/tmp/troupe-test-XXXXXX";
  const std::string directory = mkdtemp(pattern);
  const coordinator_options options = coordinator_in(directory, 1);
  const std::string worker_address = "ipc://" + directory + "/worker";
  int worker_status = -1;
  std::string worker_error, error;
  std::thread worker =
      start_worker(options.listen_address, worker_address, &worker_status, &worker_error);
  // A stranger's messages: another job's forward and a stage nobody hosts, sent once the
  // worker's socket exists so that they arrive while it runs.
  testing::eventually([&] { return std::filesystem::exists(directory + "/worker"); });
  transport::transport_context stranger;
  auto out = transport::outbox::connect(stranger, worker_address, {}, nullptr);
  ASSERT_TRUE(out);
  for (int target : {0, 9}) {
    transport::message forged;
    forged.header.kind = transport::message_kind::forward;
    forged.header.job_id = 4242;
    forged.header.target_stage = target;
    transport::add_payload(forged, {1, 12}, std::make_shared<const std::vector<float>>(12, 1.0f));
    const transport::send_result sent = out->send_waiting(forged, std::chrono::seconds(10));
    ASSERT_TRUE(sent.ok()) << sent.detail;
  }
  wall_clock clock;
  quiet_observer observer;
  auto remote = run_coordinator(config, *reference.data, options, observer, clock, &error);
  worker.join();
  std::filesystem::remove_all(directory);
  ASSERT_TRUE(remote) << error;
  EXPECT_EQ(remote->dropped_frames, 2u);
  EXPECT_EQ(weights_of(*remote), weights_of(*reference.local));
}

/// Control messages no coordinator or worker should act on: malformed JSON, wrong kinds of
/// fields, deep nesting, unknown types, and a report for a stage from a peer that hosts none.
std::vector<std::string> hostile_control_texts(const std::string& worker_address) {
  const std::string nested = std::string(20000, '[') + std::string(20000, ']');
  return {
      "not JSON {",
      "[1, 2, 3]",
      R"({"type": 7})",
      R"({"no_type": true})",
      R"({"type": "frobnicate", "address": "tcp://10.9.9.9:1"})",
      R"({"type": "hello", "host": 42, "address": "tcp://10.9.9.9:1"})",
      R"({"type": "hello", "address": [1, 2], "pid": "x"})",
      R"({"type": "hello", "protocol": 1e400})",
      R"({"type": "hello", "host": )" + nested + "}",
      R"({"type": "ready", "job_id": "abc", "address": ")" + worker_address + R"("})",
      R"({"type": "report", "stage": "zero", "staleness": {"a": 1}, "address": ")" +
          worker_address + R"("})",
      R"({"type": "report", "stage": 2, "version": 5, "address": "ipc:///nobody"})",
      R"({"type": "usage", "user_s": "lots", "address": ")" + worker_address + R"("})",
      R"({"type": "trace", "stages": "all", "clock_offset_s": {}, "address": ")" + worker_address +
          R"("})",
      R"({"type": "heartbeat", "clock_s": "now", "echo": 5})",
      R"({"type": "finish"})",
      R"({"type": "finish", "job_id": -1})",
      R"({"type": "reset", "job_id": "x"})",
      R"({"type": "assign", "stages": "all"})",
      R"({"type": "refuse", "reason": 5})",
      R"({"type": "heartbeat", "echo": {"sent_s": "a", "received_s": []}, "sent_s": null})",
  };
}

TEST(ClusterHostTest, HostileControlMessagesMidRunAreDroppedAndTheRunEndsAsUndisturbed) {
  const std::vector<std::string> overrides = {"training.epochs=10"};
  reference_run reference;
  ASSERT_NO_FATAL_FAILURE(run_reference(overrides, &reference));
  char pattern[] = "/tmp/troupe-test-XXXXXX";
  const std::string directory = mkdtemp(pattern);
  const coordinator_options options = coordinator_in(directory, 1, overrides);
  const std::string worker_address = "ipc://" + directory + "/worker";
  int worker_status = -1;
  std::string worker_error, error;
  std::thread worker =
      start_worker(options.listen_address, worker_address, &worker_status, &worker_error);
  // 10 of the run's 400 steps in, a stranger sends the hostile messages to both.
  const auto texts = hostile_control_texts(worker_address);
  transport::transport_context stranger;
  at_step observer(10, [&] {
    send_control_texts(stranger, options.listen_address, texts);
    send_control_texts(stranger, worker_address, texts);
  });
  wall_clock clock;
  auto remote =
      run_coordinator(*reference.config, *reference.data, options, observer, clock, &error);
  worker.join();
  std::filesystem::remove_all(directory);
  ASSERT_TRUE(observer.done());
  ASSERT_TRUE(remote) << error;
  EXPECT_EQ(worker_status, 0) << worker_error;
  EXPECT_EQ(remote->summary.steps, 400);
  EXPECT_EQ(remote->summary.final_test_loss, reference.local->summary.final_test_loss);
  EXPECT_EQ(weights_of(*remote), weights_of(*reference.local));
  // Each one was heard and dropped: by the coordinator all, by the worker all but the
  // well-formed report, which is no message for a worker.
  EXPECT_EQ(remote->dropped_control_messages, texts.size());
  EXPECT_EQ(remote->dropped_frames, texts.size() - 1);
}

TEST(ClusterHostTest, TheHandshakeRefusesAnotherProtocolAndAnotherJobByName) {
  reference_run job;
  ASSERT_NO_FATAL_FAILURE(load_job({}, &job));
  const std::string directory = fresh_socket_directory();
  const coordinator_options options = coordinator_in(directory, 1);
  coordinator_thread coordinator(job, options);

  // A peer speaking protocol version 1 gets a refusal that says so.
  transport::transport_context context;
  auto in = transport::inbox::bind(context, "ipc://" + directory + "/old", {}, nullptr);
  ASSERT_TRUE(in);
  auto out = transport::outbox::connect(context, options.listen_address, {}, nullptr);
  ASSERT_TRUE(out);
  const nlohmann::json hello = {{"type", "hello"},    {"protocol", 1}, {"address", in->address()},
                                {"host", "old-host"}, {"pid", 1},      {"public_key", ""}};
  ASSERT_TRUE(out->send_waiting(control_message(hello), std::chrono::seconds(10)).ok());
  nlohmann::json answer;
  for (int tries = 0; tries < 100 && answer.is_null(); ++tries) {
    auto received = in->receive(std::chrono::milliseconds(100));
    if (received && received->value) answer = control_body(*received->value);
  }
  ASSERT_FALSE(answer.is_null()) << "no answer to an old protocol's hello";
  EXPECT_EQ(answer["type"], "refuse");
  EXPECT_NE(answer.value("reason", "")
                .find("protocol version 1, this coordinator speaks " +
                      std::to_string(transport::current_protocol_version)),
            std::string::npos)
      << answer.dump();

  // A worker started for another job is refused and exits 2 naming both config hashes.
  wall_clock clock;
  worker_options stranger;
  stranger.coordinator_address = options.listen_address;
  stranger.listen_address = "ipc://" + directory + "/stranger";
  stranger.job_hash = "0123456789abcdef";
  std::string stranger_error;
  EXPECT_EQ(run_worker(stranger, clock, &stranger_error), 2);
  EXPECT_NE(stranger_error.find("refused this worker: it was started for another job (config "
                                "hash 0123456789abcdef, this job's is " +
                                job_identity_hash(*job.config) + ")"),
            std::string::npos)
      << stranger_error;

  // The coordinator is still waiting, and the job's own worker runs it to the end.
  worker_options own;
  own.coordinator_address = options.listen_address;
  own.listen_address = "ipc://" + directory + "/worker";
  own.job_hash = job_identity_hash(*job.config);
  std::string own_error;
  EXPECT_EQ(run_worker(own, clock, &own_error), 0) << own_error;
  std::string coordinator_error;
  const auto remote = coordinator.join(&coordinator_error);
  std::filesystem::remove_all(directory);
  ASSERT_TRUE(remote) << coordinator_error;
  EXPECT_EQ(remote->summary.epochs, 2);
}

TEST(ClusterHostTest, MissingWorkersAreReportedAfterTheStartupTime) {
  job_error problem;
  auto config = parse_job(job_toml, "cluster test", {}, &problem);
  ASSERT_TRUE(config);
  std::string error;
  auto data = load_job_data(*config, &error);
  char pattern[] = "/tmp/troupe-test-XXXXXX";
  const std::string directory = mkdtemp(pattern);
  coordinator_options options = coordinator_in(directory, 2);
  options.liveness.startup_s = 0.3;
  wall_clock clock;
  quiet_observer observer;
  EXPECT_FALSE(run_coordinator(*config, *data, options, observer, clock, &error));
  EXPECT_NE(error.find("only 0 of 2 workers joined"), std::string::npos) << error;
  options.workers = 4;
  EXPECT_FALSE(run_coordinator(*config, *data, options, observer, clock, &error));
  EXPECT_NE(error.find("4 workers for 3 stages"), std::string::npos) << error;
  std::filesystem::remove_all(directory);
}

TEST(ClusterHostTest, WorkersTraceTheirStagesOnTheCoordinatorsClock) {
  const std::vector<std::string> overrides = {"metrics.trace=true", "training.epochs=1"};
  reference_run job;
  ASSERT_NO_FATAL_FAILURE(load_job(overrides, &job));
  const job_config* config = &*job.config;
  const job_data* data = &*job.data;
  std::string error;
  char pattern[] = "/tmp/troupe-test-XXXXXX";
  const std::string directory = mkdtemp(pattern);
  trace_recorder trace(3);
  coordinator_options options = coordinator_in(directory, 2, overrides);
  options.pipeline.trace = &trace;
  std::vector<int> statuses(2, -1);
  std::vector<std::string> errors(2);
  // Clocks of other hosts: hours ahead of the coordinator's and an hour behind it.
  std::vector<std::thread> workers =
      start_workers(options.listen_address, directory, {5000.0, -3600.0}, &statuses, &errors);
  wall_clock clock;
  quiet_observer observer;
  const double started_us = clock.now_seconds() * 1e6;
  auto remote = run_coordinator(*config, *data, options, observer, clock, &error);
  const double ended_us = clock.now_seconds() * 1e6;
  for (auto& worker : workers) worker.join();
  std::filesystem::remove_all(directory);
  ASSERT_TRUE(remote) << error;

  const nlohmann::json timeline = trace.to_json();
  std::map<int, int> work_spans;                    // per Chrome thread id (stage + 1)
  std::map<uint64_t, std::pair<int, double>> sent;  // per arrow: its sender's track, time
  std::vector<const nlohmann::json*> received;
  for (const auto& event : timeline["traceEvents"]) {
    if (event["ph"] == "X" && event["name"] != "idle") {
      ++work_spans[event["tid"].get<int>()];
      EXPECT_GE(event["ts"].get<double>(), started_us) << event.dump();
      EXPECT_LE(event["ts"].get<double>() + event["dur"].get<double>(), ended_us)
          << event.dump() << " started " << std::fixed << started_us << " ended " << ended_us;
    } else if (event["ph"] == "s") {
      sent[event["id"].get<uint64_t>()] = {event["tid"].get<int>(), event["ts"].get<double>()};
    } else if (event["ph"] == "f") {
      received.push_back(&event);
    }
  }
  std::map<std::pair<int, int>, double> shortest_us;  // per (from, to) track: shortest delay
  for (const nlohmann::json* event : received) {
    const auto& [from, at] = sent.at((*event)["id"].get<uint64_t>());
    const std::pair<int, int> link{from, (*event)["tid"].get<int>()};
    const double delay = (*event)["ts"].get<double>() - at;
    const auto known = shortest_us.find(link);
    shortest_us[link] = known == shortest_us.end() ? delay : std::min(known->second, delay);
  }
  // 40 steps of 4 micro-batches, forward and backward, on each of the 3 stages.
  for (int stage = 0; stage < 3; ++stage) EXPECT_GE(work_spans[stage + 1], 160) << stage;
  ASSERT_GE(received.size(), 3u * 160u);
  // Each worker's records moved onto the coordinator's clock by one offset each (the spans
  // above fall inside the run), which it estimated to within half a heartbeat's round trip.
  // An arrow's delay on the merged clock is its true delay plus the receiver's estimate error
  // minus the sender's, so between two tracks the shortest delay one way plus the shortest the
  // other way is a true round trip, positive whatever the estimates' errors: a track whose
  // records were moved by anything but one offset shows here.
  int pairs = 0;
  for (const auto& [link, there_us] : shortest_us) {
    const auto back = shortest_us.find({link.second, link.first});
    if (link.first >= link.second || back == shortest_us.end()) continue;
    ++pairs;
    EXPECT_GT(there_us + back->second, 0)
        << "tracks " << link.first << " and " << link.second << ": " << there_us << " us there, "
        << back->second << " us back";
  }
  EXPECT_GE(pairs, 2) << "stages 0 and 1, 1 and 2 send to each other";
}

}  // namespace
}  // namespace troupe::actors
