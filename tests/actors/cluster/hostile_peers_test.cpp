// Peers that are not the run's: a local process that guesses its way in, a flood of hellos, a
// replacement worker that says hello before the coordinator has noticed the loss of the worker
// it replaces. Each fails the way it did before the protections (the run changed or ended, a
// socket per hello, the replacement refused and the run lost).

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "tests/support/cluster_helpers.h"
#include "tests/support/polling.h"
#include "transport/message.h"

namespace troupe::actors {
namespace {

/// Files this process holds open.
size_t open_files() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++count;
  return count;
}

/// A stranger's inbox at `address` and the first control message it receives within `limit`
/// (null when none comes).
nlohmann::json first_answer(transport::inbox& in, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto received = in.receive(std::chrono::milliseconds(50));
    if (received && received->value) return control_body(*received->value);
  }
  return nlohmann::json();
}

nlohmann::json hello_from(const std::string& address, const std::string& job_hash = "") {
  return {{"type", "hello"},     {"protocol", transport::current_protocol_version},
          {"address", address},  {"host", "stranger"},
          {"pid", 4242},         {"public_key", ""},
          {"job_hash", job_hash}};
}

TEST(HostilePeersTest, ALocalProcessWithoutTheRunsSecretCanNeitherJoinNorInject) {
  const std::vector<std::string> overrides = {"training.epochs=10"};
  reference_run reference;
  ASSERT_NO_FATAL_FAILURE(run_reference(overrides, &reference));
  const std::string directory = fresh_socket_directory();
  coordinator_options options = coordinator_in(directory, 1, overrides);
  options.run_secret = "0123456789abcdef0123456789abcdef";
  const std::string worker_address = "ipc://" + directory + "/worker";
  int worker_status = -1;
  std::string worker_error, error;
  std::thread worker([&] {
    worker_options settings;
    settings.coordinator_address = options.listen_address;
    settings.listen_address = worker_address;
    settings.run_secret = options.run_secret;
    wall_clock worker_clock;
    worker_status = run_worker(settings, worker_clock, &worker_error);
  });
  // 10 steps in, a process of the same user, which can list the run's sockets and its pid,
  // asks to join without the secret, and sends a NaN loss and a forward under each job id
  // that a pid and a counter would have made.
  transport::transport_context stranger;
  auto in = transport::inbox::bind(stranger, "ipc://" + directory + "/stranger", {}, nullptr);
  ASSERT_TRUE(in);
  at_step observer(10, [&] {
    transport::endpoint_options lingering;
    lingering.linger_ms = 10000;
    auto to_coordinator =
        transport::outbox::connect(stranger, options.listen_address, lingering, nullptr);
    auto to_worker = transport::outbox::connect(stranger, worker_address, lingering, nullptr);
    ASSERT_TRUE(to_coordinator && to_worker);
    ASSERT_TRUE(
        to_coordinator
            ->send_waiting(control_message(hello_from(in->address())), std::chrono::seconds(10))
            .ok());
    for (uint64_t counter = 0; counter < 64; ++counter) {
      const uint64_t guess =
          (static_cast<uint64_t>(::getpid()) << 20) + (uint64_t{1} << 19) + counter;
      for (uint64_t key = 0; key < 4; ++key) {
        transport::message loss;
        loss.header.kind = transport::message_kind::loss_report;
        loss.header.job_id = guess;
        loss.header.key = key;
        loss.header.source_stage = 2;
        loss.header.metrics = {{"loss_sum", std::numeric_limits<double>::quiet_NaN()},
                               {"samples", 16},
                               {"correct", 0}};
        ASSERT_TRUE(to_coordinator->send_waiting(loss, std::chrono::seconds(10)).ok());
      }
      transport::message forward;
      forward.header.kind = transport::message_kind::forward;
      forward.header.job_id = guess;
      forward.header.target_stage = 0;
      forward.header.key = 7;
      transport::add_payload(forward, {1, 12},
                             std::make_shared<const std::vector<float>>(12, 100.0f));
      ASSERT_TRUE(to_worker->send_waiting(forward, std::chrono::seconds(10)).ok());
    }
  });
  wall_clock clock;
  auto remote =
      run_coordinator(*reference.config, *reference.data, options, observer, clock, &error);
  worker.join();
  ASSERT_TRUE(observer.done());
  ASSERT_TRUE(remote) << error;
  EXPECT_EQ(worker_status, 0) << worker_error;
  EXPECT_EQ(remote->summary.steps, 400);
  EXPECT_EQ(weights_of(*remote), weights_of(*reference.local));
  EXPECT_EQ(remote->summary.final_test_loss, reference.local->summary.final_test_loss);
  // The hello got no answer at all: the run's end came long after it.
  EXPECT_TRUE(first_answer(*in, std::chrono::milliseconds(200)).is_null());
  std::filesystem::remove_all(directory);
}

TEST(HostilePeersTest, RefusedHellosHoldNoFilesOpen) {
  reference_run job;
  ASSERT_NO_FATAL_FAILURE(load_job({}, &job));
  const std::string directory = fresh_socket_directory();
  const coordinator_options options = coordinator_in(directory, 1);
  transport::transport_context stranger;
  auto in = transport::inbox::bind(stranger, "ipc://" + directory + "/stranger", {}, nullptr);
  ASSERT_TRUE(in);
  auto out = transport::outbox::connect(stranger, options.listen_address, {}, nullptr);
  ASSERT_TRUE(out);
  const size_t before = open_files();
  coordinator_thread coordinator(job, options);
  // 1,100 hellos of another job, each refused with an answer.
  constexpr int hellos = 1100;
  for (int i = 0; i < hellos; ++i) {
    ASSERT_TRUE(out->send_waiting(control_message(hello_from(in->address(), "0123456789abcdef")),
                                  std::chrono::seconds(10))
                    .ok());
  }
  int refusals = 0;
  while (refusals < hellos) {
    const nlohmann::json answer = first_answer(*in, std::chrono::seconds(20));
    if (answer.is_null()) break;
    EXPECT_EQ(answer["type"], "refuse");
    ++refusals;
  }
  EXPECT_EQ(refusals, hellos);
  // Each refusal's socket closes once its message is out: the coordinator keeps a few files
  // (its inbox, the stage data path it has not opened yet), not one per refused peer.
  EXPECT_TRUE(
      testing::eventually([&] { return open_files() < before + 64; }, std::chrono::seconds(20)))
      << open_files() << " files open, " << before << " before the hellos";
  std::string own_error;
  EXPECT_EQ(run_worker_at(options.listen_address, "ipc://" + directory + "/worker", &own_error), 0)
      << own_error;
  std::string coordinator_error;
  EXPECT_TRUE(coordinator.join(&coordinator_error)) << coordinator_error;
  std::filesystem::remove_all(directory);
}

TEST(HostilePeersTest, AReplacementThatSaysHelloBeforeTheLossIsKnownJoinsOnceItIs) {
  // The first worker joins, gets ready, then falls silent (a process that hangs or dies on a
  // host whose launcher restarts its rank at once); its replacement says hello while the
  // coordinator still counts it, and must be asked to retry, not refused for good.
  reference_run job;
  ASSERT_NO_FATAL_FAILURE(load_job({}, &job));
  const std::string directory = fresh_socket_directory();
  coordinator_options options = coordinator_in(directory, 1);
  options.liveness.timeout_s = 2.0;
  coordinator_thread coordinator(job, options);
  transport::transport_context doomed;
  auto in = transport::inbox::bind(doomed, "ipc://" + directory + "/doomed", {}, nullptr);
  ASSERT_TRUE(in);
  auto out = transport::outbox::connect(doomed, options.listen_address, {}, nullptr);
  ASSERT_TRUE(out);
  ASSERT_TRUE(
      out->send_waiting(control_message(hello_from(in->address())), std::chrono::seconds(10)).ok());
  const auto is_assignment = [](const nlohmann::json& body) {
    return body.is_object() && body.value("type", "") == "assign";
  };
  nlohmann::json assignment;
  for (int tries = 0; tries < 100 && !is_assignment(assignment); ++tries)
    assignment = first_answer(*in, std::chrono::seconds(1));
  // Without one the coordinator fails on its own once its startup time is up.
  ASSERT_TRUE(is_assignment(assignment))
      << "no assignment for the first worker: " << assignment.dump();
  nlohmann::json ready = {{"type", "ready"},
                          {"address", in->address()},
                          {"stages", assignment["stages"]},
                          {"job_id", assignment["job_id"]}};
  ASSERT_TRUE(out->send_waiting(control_message(ready), std::chrono::seconds(10)).ok());
  // Silent from here on, though its socket still takes what comes (a hung process's would).
  // The replacement says hello at once.
  std::atomic<bool> hung{true};
  std::thread swallow([&] {
    while (hung.load()) in->receive(std::chrono::milliseconds(20));
  });
  std::string replacement_error;
  EXPECT_EQ(run_worker_at(options.listen_address, "ipc://" + directory + "/replacement",
                          &replacement_error),
            0)
      << replacement_error;
  std::string coordinator_error;
  const auto remote = coordinator.join(&coordinator_error);
  hung.store(false);
  swallow.join();
  std::filesystem::remove_all(directory);
  ASSERT_TRUE(remote) << coordinator_error;
  EXPECT_EQ(remote->summary.epochs, 2);
}

}  // namespace
}  // namespace troupe::actors
