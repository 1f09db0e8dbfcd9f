// A worker's trace records travel to the coordinator's recorder: what one recorder exports the
// other takes as it is, and a record that is not one is refused whole, naming it.

#include "actors/engine/trace_recorder.h"

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

void record_two_stages(trace_recorder& trace) {
  trace.span(0, "forward", 7, 10.0, 0.002);
  trace.span(1, "forward+backward+step", 7, 10.003, 0.004);
  trace.span(-1, "checkpoint", -1, 11.0, 0.5);
  trace.flow(0, 1, 7, 10.002, 10.003);
}

TEST(TraceRecorderTest, RecordsAddedToAnEmptyRecorderGiveTheSameTrace) {
  trace_recorder worker(2);
  record_two_stages(worker);
  trace_recorder coordinator(2);
  std::string error;
  ASSERT_TRUE(coordinator.add_records(worker.records(), {0, 0, 0}, &error)) << error;
  EXPECT_EQ(coordinator.to_json(), worker.to_json());
  EXPECT_EQ(coordinator.records()["spans"].size(), 3u);
  EXPECT_EQ(coordinator.records()["flows"].size(), 1u);
}

TEST(TraceRecorderTest, ABadRecordIsRefusedByNumberAndNothingIsAdded) {
  trace_recorder worker(2);
  record_two_stages(worker);
  const nlohmann::json good = worker.records();
  struct bad_case {
    const char* list;
    size_t index;
    nlohmann::json record;
    const char* expected;
  };
  const std::vector<bad_case> cases = {
      {"spans", 1, {5, "forward", 7, 10.0, 0.1}, "span 1 is not"},     // no stage 5
      {"spans", 0, {0, "forward", 7, 10.0, -0.1}, "span 0 is not"},    // negative duration
      {"spans", 2, {0, "forward", 7, nullptr, 0.1}, "span 2 is not"},  // NaN written by JSON
      {"spans", 0, {0, std::string(200, 'x'), 7, 1.0, 0.1}, "span 0 is not"},
      {"spans", 1, {0, "forward", 7}, "span 1 is not"},     // too short
      {"flows", 0, {0, -2, 7, 1.0, 2.0}, "flow 0 is not"},  // no track -2
      {"flows", 0, "garbage", "flow 0 is not"},
  };
  for (const bad_case& c : cases) {
    nlohmann::json records = good;
    records[c.list][c.index] = c.record;
    trace_recorder coordinator(2);
    coordinator.span(0, "forward", 1, 1.0, 0.1);
    const nlohmann::json before = coordinator.to_json();
    std::string error;
    EXPECT_FALSE(coordinator.add_records(records, {0, 0, 0}, &error)) << records.dump();
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
    EXPECT_EQ(coordinator.to_json(), before) << records.dump();
  }
  trace_recorder coordinator(2);
  std::string error;
  EXPECT_FALSE(coordinator.add_records(nlohmann::json::array(), {0, 0, 0}, &error));
  EXPECT_NE(error.find("\"spans\" and \"flows\""), std::string::npos) << error;
  EXPECT_FALSE(coordinator.add_records({{"spans", 3}, {"flows", {}}}, {0, 0, 0}, &error));
  EXPECT_FALSE(coordinator.add_records(good, {0, 0}, &error));
  EXPECT_NE(error.find("clock offsets for 2 tracks; the trace has 3"), std::string::npos) << error;
  nlohmann::json negative = good;
  negative["dropped"] = -1;
  EXPECT_FALSE(coordinator.add_records(negative, {0, 0, 0}, &error));
  EXPECT_NE(error.find("\"dropped\" is not a count"), std::string::npos) << error;
}

TEST(TraceRecorderTest, ATraceKeepsItsCapacityAndCountsWhatItLeftOut) {
  trace_recorder worker(2, 3);  // room for 3 of the 4 records
  record_two_stages(worker);
  EXPECT_EQ(worker.dropped(), 1u);
  EXPECT_EQ(worker.records()["spans"].size(), 3u);
  EXPECT_TRUE(worker.records()["flows"].empty());
  EXPECT_EQ(worker.to_json()["otherData"]["dropped_records"], 1);
  // A coordinator with room for 5: one of the worker's 3 records fits after its own 4, and its
  // count carries the worker's drop.
  trace_recorder coordinator(2, 5);
  record_two_stages(coordinator);
  EXPECT_EQ(coordinator.dropped(), 0u);
  std::string error;
  ASSERT_TRUE(coordinator.add_records(worker.records(), {0, 0, 0}, &error)) << error;
  EXPECT_EQ(coordinator.dropped(), 1u + 2u);
  EXPECT_EQ(coordinator.records()["spans"].size() + coordinator.records()["flows"].size(), 5u);
  EXPECT_EQ(coordinator.to_json()["otherData"]["dropped_records"], 3);
  EXPECT_EQ(trace_recorder(2).to_json()["otherData"]["dropped_records"], 0);
}

TEST(TraceRecorderTest, EachTimeMovesByTheOffsetOfTheTrackWhoseClockTookIt) {
  trace_recorder worker(2);
  record_two_stages(worker);
  trace_recorder coordinator(2);
  std::string error;
  // The coordinator's clock reads 0; stage 0's process's clock is 100 s ahead, stage 1's 3 s.
  ASSERT_TRUE(coordinator.add_records(worker.records(), {0.0, -100.0, -3.0}, &error)) << error;
  const nlohmann::json records = coordinator.records();
  EXPECT_DOUBLE_EQ(records["spans"][0][3].get<double>(), 10.0 - 100.0);
  EXPECT_DOUBLE_EQ(records["spans"][1][3].get<double>(), 10.003 - 3.0);
  EXPECT_DOUBLE_EQ(records["spans"][1][4].get<double>(), 0.004);           // durations stay
  EXPECT_DOUBLE_EQ(records["spans"][2][3].get<double>(), 11.0);            // the coordinator's own
  EXPECT_DOUBLE_EQ(records["flows"][0][3].get<double>(), 10.002 - 100.0);  // sent by stage 0
  EXPECT_DOUBLE_EQ(records["flows"][0][4].get<double>(), 10.003 - 3.0);    // received by 1
}

}  // namespace
}  // namespace troupe::actors
