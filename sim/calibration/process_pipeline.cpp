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
#include <map>
#include <memory>
#include <mutex>

#include "actors/hosts/mail_polling.h"
#include "actors/hosts/steady_clock.h"
#include "actors/hosts/wire_format.h"
#include "layers/backend_registry.h"
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

/// The engine's own key frames, as a stage sends and decodes them: each key a payload tensor of
/// `samples` rows on this process's CPU backend, framed in place, a forward key with its
/// `samples` labels; each arrival decoded into a tensor of the backend, as a stage takes it.
class key_frames {
 public:
  explicit key_frames(int64_t samples) : samples_(samples) {
    std::string error;
    device_ = layers::create_backend("cpu", 1, &error);
    if (!device_) _exit(3);
  }

  /// A key of `bytes` of activations (forward, with labels) or gradients (backward). Its
  /// tensor is made once per kind and size: a stage's work fills a new one, which the stage's
  /// measured time already holds.
  transport::message key(transport::message_kind kind, size_t bytes) {
    actors::key_message& message = made_[{kind, bytes}];
    if (message.payload.empty()) {
      const int64_t columns =
          std::max<int64_t>(1, static_cast<int64_t>(bytes / sizeof(float)) / samples_);
      message = sample_key(*device_, {columns}, samples_);
      if (kind == transport::message_kind::backward) {  // gradients travel without labels
        message.kind = actors::key_kind::backward;
        message.labels = nullptr;
      }
    }
    message.key = next_key_++;
    return actors::to_wire(message, actors::wire_route{1, 0, 1, 0, 0.0});
  }

  /// Decodes a key that arrived (reports are not keys: they pass as they are).
  void take(const transport::message& message) {
    const transport::message_kind kind = message.header.kind;
    if (kind != transport::message_kind::forward && kind != transport::message_kind::backward) {
      return;
    }
    std::string error;
    if (!actors::key_from_wire(message, *device_, &error)) _exit(6);
  }

 private:
  int64_t samples_;
  uint64_t next_key_ = 0;
  std::unique_ptr<layers::backend> device_;
  std::map<std::pair<transport::message_kind, size_t>, actors::key_message> made_;
};

/// A process's endpoints: its inbox, whose messages a receiver thread queues for the
/// process's own thread (as a worker's receiver thread hands them to its stage's thread), which
/// polls for them for up to `spin_wait_s` before it sleeps, as a stage's thread does.
class process_endpoints {
 public:
  process_endpoints(const std::string& address, int64_t samples, double spin_wait_s)
      : frames_(samples), spin_wait_s_(spin_wait_s) {
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

  /// The next message, decoded as a stage decodes a key.
  transport::message next() {
    actors::poll_until(
        [this] {
          std::lock_guard<std::mutex> lock(mutex_);
          return !queue_.empty();
        },
        spin_wait_s_, clock_);
    transport::message message;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      arrived_.wait(lock, [&] { return !queue_.empty(); });
      message = std::move(queue_.front());
      queue_.pop_front();
    }
    frames_.take(message);
    return message;
  }

  /// Sends a key of `bytes` (forward or backward) as a stage sends one.
  void send_key(transport::outbox& out, transport::message_kind kind, size_t bytes) {
    if (!out.send_waiting(frames_.key(kind, bytes), std::chrono::seconds(30)).ok()) _exit(4);
  }

 private:
  key_frames frames_;
  double spin_wait_s_;
  actors::steady_clock clock_;
  transport::transport_context context_;
  std::unique_ptr<transport::receiver_thread> receiver_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<transport::message> queue_;
};

/// A report (a loss, a finished key): a message of one float, as small as a stage's reports.
void send_report(transport::outbox& out, transport::message_kind kind) {
  if (!out.send_waiting(filled_message(kind, sizeof(float)), std::chrono::seconds(30)).ok()) {
    _exit(4);
  }
}

std::string address(const std::string& directory, size_t process) {
  return "ipc://" + directory + "/process-" + std::to_string(process);
}

/// Stage `index`'s process; never returns. It spins for the stage's time on every key and
/// sends it on; the last stage and the first (after the key's backward) report to the
/// coordinator, as stages report losses and finished keys.
[[noreturn]] void run_stage(const std::vector<pipeline_stage_cost>& stages, int64_t samples,
                            double spin_wait_s, const std::string& directory, size_t index) {
  const size_t last = stages.size() - 1;
  const size_t coordinator = stages.size();
  process_endpoints endpoints(address(directory, index), samples, spin_wait_s);
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
        endpoints.send_key(next, transport::message_kind::forward, stage.output_bytes);
        continue;
      }
      send_report(reports, transport::message_kind::loss_report);
    } else {
      spin(stage.backward_s);
    }
    if (index > 0) {
      endpoints.send_key(previous, transport::message_kind::backward,
                         stages[index - 1].output_bytes);
    } else {
      send_report(reports, transport::message_kind::control);  // the key is done
    }
  }
}

/// The coordinator's process: admits `keys` keys, and a new one whenever one is done (with
/// `flush`: the next `keys` once all of them are done, as a sync step drains its micro-batches);
/// once 2 × `keys` are done it measures for at least `seconds`, over whole flushes, and writes
/// a measurement to `report_fd`. Never returns.
[[noreturn]] void run_coordinator(size_t input_bytes, int64_t samples, int keys, bool flush,
                                  double seconds, const std::string& directory, size_t stages,
                                  int report_fd) {
  process_endpoints endpoints(address(directory, stages), samples, /*spin_wait_s=*/0);
  const auto admit = [&](transport::outbox& first) {
    endpoints.send_key(first, transport::message_kind::forward, input_bytes);
  };
  transport::outbox first = endpoints.connect(address(directory, 0));
  for (int k = 0; k < keys; ++k) admit(first);
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
      admit(first);
    } else if (finished % keys == 0) {
      for (int k = 0; k < keys; ++k) admit(first);
    }
  }
}

}  // namespace

std::optional<double> process_pipeline_keys_per_s(const std::vector<pipeline_stage_cost>& stages,
                                                  size_t input_bytes, int64_t samples, int keys,
                                                  bool flush, double spin_wait_s, double seconds,
                                                  std::string* error) {
  if (stages.empty() || keys < 1 || samples < 1) {
    *error = "a process pipeline needs a stage and a key of a sample";
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
      if (process < stages.size()) run_stage(stages, samples, spin_wait_s, directory, process);
      run_coordinator(input_bytes, samples, keys, flush, seconds, directory, stages.size(),
                      report[1]);
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
