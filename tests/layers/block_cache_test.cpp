#include "layers/block_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "layers/cpu/cpu_backend.h"

namespace troupe::layers {
namespace {

TEST(BlockCacheTest, HandsOutAReturnedBlockOfTheSameSizeOnly) {
  block_cache cache;
  int a = 0, b = 0;
  cache.add(&a, 256);
  cache.add(&b, 512);
  EXPECT_EQ(cache.take(256), nullptr);  // nothing returned yet
  EXPECT_TRUE(cache.give_back(&a));
  EXPECT_EQ(cache.take(512), nullptr);
  EXPECT_EQ(cache.take(256), &a);
  EXPECT_EQ(cache.take(256), nullptr);  // handed out once
}

TEST(BlockCacheTest, RefusesUnknownBlocksAndBlocksPastItsLimit) {
  block_cache cache(1000);
  int a = 0, b = 0, c = 0;
  EXPECT_FALSE(cache.give_back(&a));  // never noted
  cache.add(&a, 600);
  cache.add(&b, 600);
  cache.add(&c, 400);
  EXPECT_TRUE(cache.give_back(&a));
  EXPECT_FALSE(cache.give_back(&b));  // 1200 bytes would pass the limit: forgotten
  EXPECT_FALSE(cache.give_back(&b));
  EXPECT_TRUE(cache.give_back(&c));  // exactly at the limit
  std::vector<void*> released;
  cache.drain([&](void* block) { released.push_back(block); });
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(cache.take(600), nullptr);
  EXPECT_FALSE(cache.give_back(&a));  // drained blocks are forgotten
}

TEST(BlockCacheTest, TheCpuBackendReusesAFreedLargeBlock) {
  std::unique_ptr<backend> cpu = make_cpu_backend(1);
  const size_t bytes = size_t(4) << 20;
  void* first = cpu->allocate(bytes);
  cpu->deallocate(first);
  void* second = cpu->allocate(bytes);
  EXPECT_EQ(second, first);
  void* third = cpu->allocate(bytes);  // the first is out again: a new block
  EXPECT_NE(third, first);
  cpu->deallocate(second);
  cpu->deallocate(third);
  void* small = cpu->allocate(64);  // small blocks come from malloc and go back to it
  cpu->deallocate(small);
}

}  // namespace
}  // namespace troupe::layers
