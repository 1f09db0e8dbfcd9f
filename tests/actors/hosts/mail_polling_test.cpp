// A stage thread polls its mailbox before it sleeps: the poll ends on mail, at its budget, or
// when the machine has no core to spare, and reads the runnable threads from /proc/loadavg.

#include "actors/hosts/mail_polling.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "actors/hosts/actor_hosting.h"
#include "tests/support/engine_helpers.h"

namespace troupe::actors {
namespace {

/// Advances a millisecond at every reading.
class ticking_clock final : public clock_source {
 public:
  double now_seconds() override { return 0.001 * static_cast<double>(readings++); }
  int readings = 0;
};

bool always_spare() { return true; }
bool never_spare() { return false; }

/// What a poll of `budget_ms` on a ticking clock ended with, and how often it read the clock.
struct poll_result {
  int end = -1;
  int readings = 0;
};

poll_result poll_once(int budget_ms, bool (*spare_core)()) {
  caf::actor_system_config settings;
  caf::actor_system system{settings};
  caf::scoped_actor self{system};
  auto poller =
      system.spawn<caf::detached>([spare_core](caf::event_based_actor* actor) -> caf::behavior {
        return {[actor, spare_core](int budget) {
          ticking_clock clock;
          const poll_end end = poll_for_mail(actor, budget / 1000.0, clock, spare_core);
          return std::vector<int>{static_cast<int>(end), clock.readings};
        }};
      });
  poll_result result;
  self->request(poller, std::chrono::seconds(60), budget_ms)
      .receive(
          [&](const std::vector<int>& answer) {
            result = {answer[0], answer[1]};
          },
          [](const caf::error& error) { FAIL() << caf::to_string(error); });
  self->send_exit(poller, caf::exit_reason::user_shutdown);
  return result;
}

TEST(MailPollingTest, CountsTheCallerAmongTheRunnableThreads) {
  if (!std::filesystem::exists("/proc/loadavg")) GTEST_SKIP() << "no /proc/loadavg";
  EXPECT_GE(runnable_threads(), 1);
}

TEST(MailPollingTest, APollWithoutMailEndsAtItsBudget) {
  // 20 ticks of the clock: the poll reads it about 20 times, then gives up.
  const poll_result polled = poll_once(20, always_spare);
  EXPECT_EQ(polled.end, static_cast<int>(poll_end::budget));
  EXPECT_NEAR(polled.readings, 21, 1);
  const poll_result unpolled = poll_once(0, always_spare);
  EXPECT_EQ(unpolled.end, static_cast<int>(poll_end::budget));
  EXPECT_EQ(unpolled.readings, 0) << "no budget: no poll";
}

TEST(MailPollingTest, APollGivesWayAtTheSecondCheckThatFindsNoSpareCore) {
  const poll_result polled = poll_once(1000, never_spare);
  EXPECT_EQ(polled.end, static_cast<int>(poll_end::no_spare_core));
  EXPECT_LE(polled.readings, 3) << "checks at the start and half a millisecond later";
}

TEST(MailPollingTest, APollEndsWhenMailArrives) {
  caf::actor_system_config settings;
  caf::actor_system system{settings};
  caf::scoped_actor self{system};
  testing::wall_clock clock;
  // On "poll" the actor tells the test that it polls, polls for up to 10 minutes and then says
  // why the poll ended; the test's next message is the mail that should end it.
  auto poller = system.spawn<caf::detached>(
      [&clock](caf::event_based_actor* actor, caf::actor test) -> caf::behavior {
        return {[actor, test, &clock](const std::string& what) {
          if (what != "poll") return;
          actor->send(test, std::string("polling"));
          const poll_end end = poll_for_mail(actor, 600, clock, always_spare);
          actor->send(test, static_cast<int>(end));
        }};
      },
      caf::actor{self});
  self->send(poller, std::string("poll"));
  self->receive([](const std::string& what) { EXPECT_EQ(what, "polling"); });
  self->send(poller, std::string("mail"));
  int end = -1;
  self->receive([&](int why) { end = why; }, caf::after(std::chrono::seconds(60)) >> [] {});
  EXPECT_EQ(end, static_cast<int>(poll_end::mail)) << "the poll did not end on mail";
  self->send_exit(poller, caf::exit_reason::user_shutdown);
}

TEST(MailPollingTest, APollForAnythingEndsWhenItArrivesOrAtItsBudget) {
  // Calibration's stand-in stages poll their own queues by the same rule.
  ticking_clock clock;
  int asked = 0;
  EXPECT_EQ(poll_until([&] { return ++asked > 5; }, 1.0, clock, always_spare), poll_end::mail);
  EXPECT_EQ(asked, 6);
  ticking_clock other;
  EXPECT_EQ(poll_until([] { return false; }, 0.02, other, always_spare), poll_end::budget);
  EXPECT_NEAR(other.readings, 21, 1);
  ticking_clock crowded;
  EXPECT_EQ(poll_until([] { return false; }, 1.0, crowded, never_spare), poll_end::no_spare_core);
}

TEST(MailPollingTest, SyncStagesPollTenMillisecondsAndAsyncStagesNoneUnlessTheJobSays) {
  parallelism_config parallelism;
  parallelism.mode = pipeline_mode::sync;
  EXPECT_DOUBLE_EQ(spin_wait_seconds(parallelism), 0.010);
  parallelism.mode = pipeline_mode::async;
  EXPECT_DOUBLE_EQ(spin_wait_seconds(parallelism), 0.0);
  parallelism.spin_wait_ms = 2.5;
  EXPECT_DOUBLE_EQ(spin_wait_seconds(parallelism), 0.0025);
  parallelism.mode = pipeline_mode::sync;
  parallelism.spin_wait_ms = 0;
  EXPECT_DOUBLE_EQ(spin_wait_seconds(parallelism), 0.0);
}

}  // namespace
}  // namespace troupe::actors
