#include "actors/hosts/mail_polling.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

namespace troupe::actors {
namespace {

/// How often a polling thread asks whether the machine still has a core to spare.
constexpr double load_check_interval_s = 0.0005;

/// /proc/loadavg, opened once and read with pread: "0.52 0.58 0.59 3/412 8123", the fourth
/// field's numerator being the threads runnable now.
int loadavg_file() {
  static const int descriptor = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  return descriptor;
}

}  // namespace

int runnable_threads() {
  const int descriptor = loadavg_file();
  if (descriptor < 0) return -1;
  char text[128];
  const ssize_t length = ::pread(descriptor, text, sizeof text - 1, 0);
  if (length <= 0) return -1;
  text[length] = '\0';
  const char* field = text;
  for (int spaces = 0; spaces < 3 && *field != '\0'; ++field) {
    if (*field == ' ') ++spaces;
  }
  char* end = nullptr;
  const long running = std::strtol(field, &end, 10);
  if (end == field || *end != '/' || running < 0) return -1;
  return static_cast<int>(running);
}

bool machine_has_spare_core() {
  static const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const int running = runnable_threads();
  return running < 0 || cores <= 0 || running <= cores;
}

poll_end poll_until(const std::function<bool()>& arrived, double seconds, clock_source& clock,
                    bool (*spare_core)()) {
  if (arrived()) return poll_end::mail;
  if (seconds <= 0) return poll_end::budget;
  const double start = clock.now_seconds();
  double next_check = start;
  // Other work on the machine makes a thread runnable now and then; the poller gives way only
  // when two checks in a row find every core taken.
  int busy_checks = 0;
  for (double now = start; now - start < seconds; now = clock.now_seconds()) {
    if (now >= next_check) {
      busy_checks = spare_core() ? 0 : busy_checks + 1;
      if (busy_checks == 2) return poll_end::no_spare_core;
      next_check = now + load_check_interval_s;
    }
    if (arrived()) return poll_end::mail;
    ::sched_yield();
  }
  return poll_end::budget;
}

poll_end poll_for_mail(caf::scheduled_actor* self, double seconds, clock_source& clock,
                       bool (*spare_core)()) {
  return poll_until([self] { return !self->mailbox().empty(); }, seconds, clock, spare_core);
}

}  // namespace troupe::actors
