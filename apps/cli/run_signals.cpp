#include "apps/cli/run_signals.h"

#include <signal.h>
#include <unistd.h>

#include "apps/cli/local_workers.h"

namespace troupe::apps {
namespace {

std::atomic<int> checkpoint_requests{0};
std::atomic<bool> stopping{false};
std::atomic<bool> status_asked{false};

void end_now(int signal_number) {
  local_workers::terminate_all();
  _exit(128 + signal_number);
}

void on_signal(int signal_number) {
  if (signal_number == SIGUSR2) {
    status_asked.store(true);
    return;
  }
  if (signal_number == SIGUSR1) {
    int none = 0;
    checkpoint_requests.compare_exchange_strong(none, 1);
    return;
  }
  if (signal_number == SIGTERM && !stopping.exchange(true)) {
    checkpoint_requests.store(2);
    return;
  }
  end_now(signal_number);
}

}  // namespace

void handle_signals(void (*handler)(int), std::initializer_list<int> signals) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  for (int signal_number : signals) sigaction(signal_number, &action, nullptr);
}

std::atomic<int>* install_run_signals() {
  handle_signals(on_signal, {SIGINT, SIGTERM, SIGUSR1, SIGUSR2});
  return &checkpoint_requests;
}

std::atomic<bool>* status_requests() { return &status_asked; }

namespace {

std::atomic<bool> worker_stop_requests{false};
std::atomic<bool> worker_stopping{false};

void on_worker_signal(int signal_number) {
  if (!worker_stopping.exchange(true)) {
    worker_stop_requests.store(true);
    return;
  }
  _exit(128 + signal_number);
}

}  // namespace

std::atomic<bool>* install_worker_signals() {
  handle_signals(on_worker_signal, {SIGTERM});
  return &worker_stop_requests;
}

}  // namespace troupe::apps
