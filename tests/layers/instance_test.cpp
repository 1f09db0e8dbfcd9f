#include "layers/instance.h"

#include <gtest/gtest.h>

#include <string>

namespace troupe::layers {
namespace {

instance_dataset tree_data() {
  instance_dataset data;
  data.vocabulary = 4;
  data.classes = 3;
  data.arity = 2;
  return data;
}

/// ((0 1) 2): leaves 0, 1, their node 2, leaf 3, the root 4.
instance small_tree() { return {{0, 1, 3, 2, 3}, {2, 2, 4, 4, -1}, {1}}; }

TEST(InstanceTest, TotalPartsSumsEveryInstance) {
  instance_dataset data = tree_data();
  data.instances = {small_tree(), {{1, 2, 3}, {}, {0, 1, 2}}};
  EXPECT_EQ(data.total_parts(), 8);
  EXPECT_EQ(instance_dataset{}.total_parts(), 0);
}

TEST(InstanceTest, WellFormedTreeAndSequencePass) {
  const instance_dataset data = tree_data();
  EXPECT_EQ(instance_error(data, small_tree()), "");
  const instance sequence{{1, 2, 3}, {}, {0, 1, 2}};
  EXPECT_EQ(instance_error(data, sequence), "");
  EXPECT_EQ(sequence.parent_of(1), 2);
  EXPECT_EQ(sequence.parent_of(2), -1);
  EXPECT_EQ(instance_error(data, {{1}, {-1}, {2}}), "");
}

TEST(InstanceTest, EachDefectIsNamed) {
  const instance_dataset data = tree_data();
  auto with = [](auto change) {
    instance item = small_tree();
    change(item);
    return item;
  };
  const auto error = [&data](const instance& item) { return instance_error(data, item); };
  EXPECT_NE(error(with([](instance& i) { i.tokens[1] = 4; })).find("part 1's token 4"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.tokens[0] = -1; })).find("outside [0, 4)"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.parent[3] = -1; })).find("second root"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.parent[4] = 3; })).find("not the root"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.parent[2] = 1; })).find("does not come after"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.parent[1] = 4; })).find("part 4 has more children"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.parent.pop_back(); })).find("4 parents"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) {
              i.labels = {0, 1};
            })).find("2 labels for 5 parts"),
            std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.labels = {}; })).find("0 labels"), std::string::npos);
  EXPECT_NE(error(with([](instance& i) { i.labels = {3}; })).find("label 0 3"), std::string::npos);
  EXPECT_EQ(error(instance{}), "the instance has no parts");
}

TEST(InstanceTest, ArityBoundsChildren) {
  instance_dataset data = tree_data();
  const instance three_children{{0, 1, 2, 3}, {3, 3, 3, -1}, {0}};
  EXPECT_NE(instance_error(data, three_children).find("part 3 has more children"),
            std::string::npos);
  data.arity = 3;
  EXPECT_EQ(instance_error(data, three_children), "");
  data.arity = 0;
  EXPECT_NE(instance_error(data, {{1, 2}, {}, {0, 1}}), "");
}

}  // namespace
}  // namespace troupe::layers
