#include "sim/calibration/process_pipeline.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>

#include "sim/calibration/measuring.h"
#include "transport/endpoint.h"
#include "transport/message.h"

namespace troupe::sim {
namespace {

using clock_type = std::chrono::steady_clock;

/// Keeps this thread's core busy for `seconds` of its own CPU time: time the operating system
/// gives to other processes does not count, as it does not for a stage's real work.
void spin(double seconds) {
  const double end = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) + seconds;
  volatile double sink = 1;
  while (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) < end) {
    for (int i = 0; i < 64; ++i) sink = sink * 1.0000001;
  }
}

/// What the first stage's process reports through the pipe.
struct measurement {
  double keys = 0;
  double seconds = 0;
};

/// A process's endpoints: its inbox, whose messages a receiver thread queues for the
/// process's own thread (as a worker's receiver thread hands them to its stage's thread).
class process_endpoints {
 public:
  process_endpoints(const std::string& address) {
    auto in = transport::inbox::bind(context_, address);
    if (!in) _exit(3);
    std::vector<transport::inbox> inboxes;
    inboxes.push_back(std::move(*in));
    receiver_ = std::make_unique<transport::receiver_thread>(
        context_, std::move(inboxes), [this](transport::message&& message) {
          std::lock_guard<std::mutex> lock(mutex_);
          queue_.push_back(std::move(message));
          arrived_.notify_one();
        });
  }

  transport::outbox connect(const std::string& address) {
    auto out = transport::outbox::connect(context_, address);
    if (!out) _exit(3);
    return std::move(*out);
  }

  /// The next message, its payload copied off it as a stage decodes a key.
  transport::message next() {
    transport::message message;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      arrived_.wait(lock, [&] { return !queue_.empty(); });
      message = std::move(queue_.front());
      queue_.pop_front();
    }
    for (const transport::frame& payload : message.payloads) {
      decoded_.resize(payload.bytes);
      std::memcpy(decoded_.data(), payload.data, payload.bytes);
    }
    return message;
  }

 private:
  transport::transport_context context_;
  std::unique_ptr<transport::receiver_thread> receiver_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<transport::message> queue_;
  std::vector<char> decoded_;
};

void send(transport::outbox& out, transport::message_kind kind, size_t bytes) {
  if (!out.send_waiting(filled_message(kind, bytes), std::chrono::seconds(30)).ok()) _exit(4);
}

std::string address(const std::string& directory, size_t process) {
  return "ipc://" + directory + "/process-" + std::to_string(process);
}

/// Stage `index`'s process; never returns. It spins for the stage's time on every key and
/// sends it on; the last stage and the first (after the key's backward) report to the
/// coordinator, as stages report losses and finished keys.
[[noreturn]] void run_stage(const std::vector<pipeline_stage_cost>& stages,
                            const std::string& directory, size_t index) {
  const size_t last = stages.size() - 1;
  const size_t coordinator = stages.size();
  process_endpoints endpoints(address(directory, index));
  transport::outbox next = endpoints.connect(address(directory, index < last ? index + 1 : index));
  transport::outbox previous =
      endpoints.connect(address(directory, index > 0 ? index - 1 : coordinator));
  transport::outbox reports = endpoints.connect(address(directory, coordinator));
  const pipeline_stage_cost& stage = stages[index];
  for (;;) {
    const transport::message message = endpoints.next();
    if (message.header.kind == transport::message_kind::forward) {
      spin(stage.forward_s);
      if (index < last) {
        send(next, transport::message_kind::forward, stage.output_bytes);
        continue;
      }
      send(reports, transport::message_kind::loss_report, sizeof(float));
    } else {
      spin(stage.backward_s);
    }
    if (index > 0) {
      send(previous, transport::message_kind::backward, stages[index - 1].output_bytes);
    } else {
      send(reports, transport::message_kind::control, sizeof(float));  // the key is done
    }
  }
}

/// The coordinator's process: admits `keys` keys, and a new one whenever one is done (with
/// `flush`: the next `keys` once all of them are done, as a sync step drains its micro-batches);
/// once 2 × `keys` are done it measures for at least `seconds`, over whole flushes, and writes
/// a measurement to `report_fd`. Never returns.
[[noreturn]] void run_coordinator(size_t input_bytes, int keys, bool flush, double seconds,
                                  const std::string& directory, size_t stages, int report_fd) {
  process_endpoints endpoints(address(directory, stages));
  transport::outbox first = endpoints.connect(address(directory, 0));
  for (int k = 0; k < keys; ++k) send(first, transport::message_kind::forward, input_bytes);
  int64_t finished = 0;
  const int64_t warm_up = 2 * static_cast<int64_t>(keys);
  clock_type::time_point measuring_since;
  bool reported = false;
  for (;;) {
    if (endpoints.next().header.kind != transport::message_kind::control) continue;
    ++finished;
    if (finished == warm_up) measuring_since = clock_type::now();
    if (finished > warm_up && !reported) {
      const double elapsed =
          std::chrono::duration<double>(clock_type::now() - measuring_since).count();
      if (elapsed >= seconds && finished - warm_up >= keys && (!flush || finished % keys == 0)) {
        const measurement result{static_cast<double>(finished - warm_up), elapsed};
        reported = write(report_fd, &result, sizeof result) == sizeof result;
      }
    }
    if (!flush) {
      send(first, transport::message_kind::forward, input_bytes);
    } else if (finished % keys == 0) {
      for (int k = 0; k < keys; ++k) send(first, transport::message_kind::forward, input_bytes);
    }
  }
}

}  // namespace

std::optional<double> process_pipeline_keys_per_s(const std::vector<pipeline_stage_cost>& stages,
                                                  size_t input_bytes, int keys, bool flush,
                                                  double seconds, std::string* error) {
  if (stages.empty() || keys < 1) {
    *error = "a process pipeline needs a stage and a key";
    return std::nullopt;
  }
  char pattern[] = "/tmp/troupe-pipeline-XXXXXX";
  if (!mkdtemp(pattern)) {
    *error = "cannot create a directory for the ipc:// endpoints";
    return std::nullopt;
  }
  const std::string directory = pattern;
  int report[2];
  if (pipe(report) != 0) {
    rmdir(pattern);
    *error = std::string("cannot create a pipe: ") + std::strerror(errno);
    return std::nullopt;
  }
  const pid_t parent = getpid();
  std::vector<pid_t> children;
  // Processes 0..S-1 are the stages, process S the coordinator.
  for (size_t process = 0; process <= stages.size(); ++process) {
    const pid_t child = fork();
    if (child == 0) {
      // Dies with the calibration, whatever ends it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(5);
      close(report[0]);
      if (process < stages.size()) run_stage(stages, directory, process);
      run_coordinator(input_bytes, keys, flush, seconds, directory, stages.size(), report[1]);
    }
    if (child < 0) break;
    children.push_back(child);
  }
  close(report[1]);
  measurement result;
  bool measured = false;
  if (children.size() == stages.size() + 1) {
    // A stage's own time, at least, for every key of the warm-up and the measurement.
    double per_key = 0;
    for (const pipeline_stage_cost& stage : stages) per_key += stage.forward_s + stage.backward_s;
    const double limit_s = 30 + 3 * seconds + 6 * per_key * keys;
    pollfd ready{report[0], POLLIN, 0};
    int polled = 0;
    while ((polled = poll(&ready, 1, static_cast<int>(1000 * limit_s))) < 0 && errno == EINTR) {
    }
    measured = polled == 1 && read(report[0], &result, sizeof result) == sizeof result;
  }
  close(report[0]);
  for (pid_t child : children) kill(child, SIGKILL);
  for (pid_t child : children) {
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  for (size_t process = 0; process <= stages.size(); ++process) {
    std::remove(address(directory, process).substr(std::strlen("ipc://")).c_str());
  }
  rmdir(pattern);
  if (!measured || result.seconds <= 0) {
    *error = children.size() == stages.size() + 1
                 ? "the stand-in pipeline's processes stopped passing keys"
                 : "cannot start the stand-in pipeline's processes";
    return std::nullopt;
  }
  return result.keys / result.seconds;
}

}  // namespace troupe::sim
