// `troupe keygen`'s key files: written with the right modes, read back by transport, and
// refused for a name, a pair or an existing secret that must not be written.

#include "actors/cluster/key_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/file_system_fakes.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using transport::curve_key_pair;

curve_key_pair fresh_pair() {
  std::string error;
  std::optional<curve_key_pair> pair = transport::generate_key_pair(&error);
  EXPECT_TRUE(pair) << error;
  return pair.value_or(curve_key_pair{});
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(KeyFilesTest, KeygenWritesPrivateSecretAndTransportReadsItBack) {
  char pattern[] = "/tmp/troupe-keys-XXXXXX";
  const std::string root = mkdtemp(pattern), keys = root + "/keys";
  const curve_key_pair pair = fresh_pair();
  std::string error;
  ASSERT_TRUE(write_key_pair(keys, "worker-1", pair, &error)) << error;
  struct stat info {};
  ASSERT_EQ(::stat(keys.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((keys + "/worker-1.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((keys + "/worker-1.pub").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);

  std::optional<curve_key_pair> read = transport::read_key_pair(keys, "worker-1", &error);
  ASSERT_TRUE(read) << error;
  EXPECT_EQ(read->public_key, pair.public_key);
  EXPECT_EQ(read->secret_key, pair.secret_key);

  const curve_key_pair other = fresh_pair();
  ASSERT_TRUE(write_key_pair(keys, "coordinator", other, &error)) << error;
  auto allowed = transport::read_public_keys(keys, &error);
  ASSERT_TRUE(allowed) << error;
  EXPECT_EQ(*allowed, (std::vector<std::string>{other.public_key, pair.public_key}));

  EXPECT_FALSE(write_key_pair(keys, "worker-1", other, &error));
  EXPECT_TRUE(contains(error, "worker-1.key")) << error;
  EXPECT_TRUE(contains(error, "already exists")) << error;
  EXPECT_FALSE(write_key_pair(keys, "../escape", other, &error));
  EXPECT_TRUE(contains(error, "key name '../escape'")) << error;
  EXPECT_FALSE(
      write_key_pair(keys, "bad", curve_key_pair{pair.public_key, other.secret_key}, &error));
  EXPECT_TRUE(contains(error, "bad.key: refusing to write")) << error;
  fs::remove_all(root);
}

TEST(KeyFilesTest, AFailedSecondWriteIsReportedAndLeavesNoPublicKey) {
  testing::memory_file_system memory;
  testing::faulty_file_system files(memory);
  files.fail_at_write(2);  // NAME.pub
  std::string error;
  EXPECT_FALSE(write_key_pair("/keys", "node", fresh_pair(), &error, files));
  EXPECT_TRUE(contains(error, "no space left")) << error;
  EXPECT_EQ(memory.mode_of("/keys/node.key"), 0600u);
  EXPECT_FALSE(memory.exists("/keys/node.pub"));
}

}  // namespace
}  // namespace troupe::actors
