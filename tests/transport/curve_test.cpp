#include "transport/curve.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.h>

#include "tests/support/polling.h"
#include "transport/endpoint.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// How long a test waits to be sure that something does NOT arrive.
constexpr auto quiet_period = 300ms;

using testing::eventually;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fresh directory under the test temp dir, removed at the end of the test.
class scratch_directory {
 public:
  scratch_directory() {
    std::string pattern = (fs::path(::testing::TempDir()) / "troupe-curve-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~scratch_directory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::trunc) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

curve_key_pair fresh_pair() {
  std::string error;
  std::optional<curve_key_pair> pair = generate_key_pair(&error);
  EXPECT_TRUE(pair) << error;
  return pair.value_or(curve_key_pair{});
}

message keyed_message(uint64_t key) {
  message result;
  result.header.kind = message_kind::forward;
  result.header.key = key;
  add_payload(result, {2}, std::make_shared<const std::vector<float>>(std::vector<float>{1, 2}));
  return result;
}

endpoint_options server_options(const curve_key_pair& server,
                                std::vector<std::string> allowed_keys) {
  endpoint_options options;
  options.security.curve = true;
  options.security.own = server;
  options.security.allowed_public_keys = std::move(allowed_keys);
  return options;
}

endpoint_options client_options(const curve_key_pair& client, const std::string& server_key) {
  endpoint_options options;
  options.security.curve = true;
  options.security.own = client;
  options.security.server_public_key = server_key;
  return options;
}

// Sends key `key` from a new outbox with `options` to `address`.
std::optional<outbox> connected_sender(transport_context& context, const std::string& address,
                                       const endpoint_options& options, uint64_t key) {
  endpoint_error error;
  std::optional<outbox> out = outbox::connect(context, address, options, &error);
  EXPECT_TRUE(out) << error.text;
  EXPECT_TRUE(out && out->send(keyed_message(key)).ok());
  return out;
}

// A CURVE inbox on loopback tcp admitting `client`, with its authenticator and server keys.
struct curve_server {
  transport_context context;
  curve_key_pair keys = fresh_pair();
  std::unique_ptr<zap_authenticator> authenticator;
  std::optional<inbox> in;

  explicit curve_server(const curve_key_pair& client) {
    std::string problem;
    authenticator = zap_authenticator::start(context, &problem);
    EXPECT_TRUE(authenticator) << problem;
    endpoint_error error;
    in = inbox::bind(context, "tcp://127.0.0.1:*", server_options(keys, {client.public_key}),
                     &error);
    EXPECT_TRUE(in) << error.text;
  }
  // The inbox and authenticator must go before the context.
  ~curve_server() {
    in.reset();
    authenticator.reset();
  }
};

/// The listed `client` reaches `server`'s inbox, and only its message (key 2) arrives.
void expect_listed_client_gets_through(curve_server& server, const curve_key_pair& client) {
  std::optional<outbox> listed = connected_sender(
      server.context, server.in->address(), client_options(client, server.keys.public_key), 2);
  std::optional<decode_result> received = server.in->receive(10s);
  ASSERT_TRUE(received && received->ok());
  EXPECT_EQ(received->value->header.key, 2u);
  EXPECT_FALSE(server.in->receive(quiet_period));
}

TEST(CurveTest, LibzmqHasCurve) { EXPECT_TRUE(curve_available()); }

TEST(CurveTest, BadKeyFilesAreRejectedByName) {
  scratch_directory directory;
  const curve_key_pair pair = fresh_pair();
  std::string error;
  EXPECT_FALSE(read_key_pair(directory.path(), "node", &error));
  EXPECT_TRUE(contains(error, "node.key: missing")) << error;

  write_text(directory.file("node.key"), pair.secret_key + "\n", 0644);
  write_text(directory.file("node.pub"), pair.public_key + "\n", 0644);
  EXPECT_FALSE(read_key_pair(directory.path(), "node", &error));
  EXPECT_TRUE(contains(error, "node.key")) << error;
  EXPECT_TRUE(contains(error, "group or others")) << error;

  ASSERT_EQ(::chmod(directory.file("node.key").c_str(), 0600), 0);
  std::optional<curve_key_pair> read = read_key_pair(directory.path(), "node", &error);
  ASSERT_TRUE(read) << error;

  write_text(directory.file("node.pub"), pair.public_key.substr(1), 0644);
  EXPECT_FALSE(read_key_pair(directory.path(), "node", &error));
  EXPECT_TRUE(contains(error, "node.pub: has 39 characters")) << error;

  write_text(directory.file("node.key"), "~" + pair.secret_key.substr(1), 0600);
  EXPECT_FALSE(read_key_pair(directory.path(), "node", &error));
  EXPECT_TRUE(contains(error, "node.key: character 0x7e at offset 0 is not Z85")) << error;

  write_text(directory.file("node.key"), fresh_pair().secret_key, 0600);
  write_text(directory.file("node.pub"), pair.public_key, 0644);
  EXPECT_FALSE(read_key_pair(directory.path(), "node", &error));
  EXPECT_TRUE(contains(error, "node.pub: does not match node.key")) << error;

  write_text(directory.file("stranger.pub"), "not a key", 0644);
  EXPECT_FALSE(read_public_keys(directory.path(), &error));
  EXPECT_TRUE(contains(error, "stranger.pub")) << error;

  scratch_directory empty;
  EXPECT_FALSE(read_public_keys(empty.path(), &error));
  EXPECT_TRUE(contains(error, "no *.pub files")) << error;
  EXPECT_FALSE(read_public_keys(empty.file("absent"), &error));
  EXPECT_TRUE(contains(error, "absent")) << error;
}

TEST(CurveTest, LoopbackAddresses) {
  for (const char* address : {"inproc://troupe-1/stage-0", "ipc:///tmp/troupe/stage-1",
                              "tcp://127.0.0.1:5550", "tcp://127.1.2.3:*", "tcp://localhost:5550",
                              "tcp://[::1]:5550", "tcp://[::ffff:127.0.0.1]:5550"}) {
    EXPECT_TRUE(is_loopback_address(address)) << address;
  }
  for (const char* address : {"tcp://10.0.0.5:5550", "tcp://0.0.0.0:5550", "tcp://*:5550",
                              "tcp://eth0:5550", "tcp://127.evil.example:5550", "tcp://[::]:5550",
                              "tcp://[2001:db8::1]:5550", "tcp://127.0.0.1:5550;10.0.0.5:5550",
                              "udp://127.0.0.1:5550", "pgm://eth0;239.1.1.1:5555", "", "tcp://"}) {
    EXPECT_FALSE(is_loopback_address(address)) << address;
  }
}

TEST(CurveTest, ListedClientDeliversOverCurve) {
  const curve_key_pair client = fresh_pair();
  curve_server server(client);
  ASSERT_TRUE(server.in);
  std::optional<outbox> out = connected_sender(server.context, server.in->address(),
                                               client_options(client, server.keys.public_key), 7);
  std::optional<decode_result> received = server.in->receive(10s);
  ASSERT_TRUE(received && received->ok()) << (received ? received->error.text : "timeout");
  EXPECT_EQ(received->value->header.key, 7u);
  EXPECT_GE(server.authenticator->admitted(), 1u);
  EXPECT_EQ(server.authenticator->denied(), 0u);
}

TEST(CurveTest, UnlistedClientCannotDeliver) {
  const curve_key_pair client = fresh_pair();
  const curve_key_pair stranger = fresh_pair();
  curve_server server(client);
  ASSERT_TRUE(server.in);
  std::optional<outbox> intruder = connected_sender(
      server.context, server.in->address(), client_options(stranger, server.keys.public_key), 1);
  ASSERT_TRUE(eventually([&] { return server.authenticator->denied() >= 1; }));
  EXPECT_TRUE(contains(server.authenticator->last_denial(), stranger.public_key))
      << server.authenticator->last_denial();
  EXPECT_FALSE(server.in->receive(quiet_period));

  // The inbox is alive: the listed client gets through, and only its message arrives.
  expect_listed_client_gets_through(server, client);
}

TEST(CurveTest, PlaintextClientCannotDeliverToCurveInbox) {
  const curve_key_pair client = fresh_pair();
  curve_server server(client);
  ASSERT_TRUE(server.in);
  std::optional<outbox> plaintext = connected_sender(server.context, server.in->address(), {}, 1);
  EXPECT_FALSE(server.in->receive(quiet_period));
  expect_listed_client_gets_through(server, client);
}

TEST(CurveTest, ClientWithWrongServerKeyCannotDeliver) {
  const curve_key_pair client = fresh_pair();
  curve_server server(client);
  ASSERT_TRUE(server.in);
  std::optional<outbox> misled = connected_sender(
      server.context, server.in->address(), client_options(client, fresh_pair().public_key), 1);
  EXPECT_FALSE(server.in->receive(quiet_period));
}

TEST(CurveTest, NonLoopbackWithoutKeysIsRefusedUnlessInsecureIsAllowed) {
  transport_context context;
  endpoint_error error;
  EXPECT_FALSE(inbox::bind(context, "tcp://10.0.0.5:5550", {}, &error));
  EXPECT_EQ(error.text, "binding tcp://10.0.0.5:5550 without CURVE keys; pass keys or --insecure");
  EXPECT_FALSE(outbox::connect(context, "tcp://10.0.0.5:5550", {}, &error));
  EXPECT_TRUE(contains(error.text, "connecting to tcp://10.0.0.5:5550 without CURVE"))
      << error.text;
  EXPECT_FALSE(inbox::bind(context, "tcp://0.0.0.0:*", {}, &error));

  endpoint_options insecure;
  insecure.security.allow_insecure = true;
  EXPECT_TRUE(inbox::bind(context, "tcp://0.0.0.0:*", insecure, &error)) << error.text;
  EXPECT_TRUE(outbox::connect(context, "tcp://10.0.0.5:5550", insecure, &error)) << error.text;
}

TEST(CurveTest, CurveEndpointsCheckTheirSettings) {
  transport_context context;
  const curve_key_pair server = fresh_pair();
  const curve_key_pair client = fresh_pair();
  endpoint_error error;
  EXPECT_FALSE(inbox::bind(context, "tcp://127.0.0.1:*",
                           server_options(server, {client.public_key}), &error));
  EXPECT_TRUE(contains(error.text, "no zap_authenticator")) << error.text;

  std::string problem;
  std::unique_ptr<zap_authenticator> authenticator = zap_authenticator::start(context, &problem);
  ASSERT_TRUE(authenticator) << problem;
  EXPECT_FALSE(zap_authenticator::start(context, &problem));
  EXPECT_TRUE(contains(problem, "already runs")) << problem;
  authenticator->stop();
  authenticator = zap_authenticator::start(context, &problem);
  ASSERT_TRUE(authenticator) << problem;

  EXPECT_FALSE(inbox::bind(context, "tcp://127.0.0.1:*", server_options(server, {}), &error));
  EXPECT_TRUE(contains(error.text, "no allowed public keys")) << error.text;
  EXPECT_FALSE(
      inbox::bind(context, "tcp://127.0.0.1:*", server_options(server, {"short"}), &error));
  EXPECT_TRUE(contains(error.text, "allowed public key 0 has 5 characters")) << error.text;
  EXPECT_FALSE(inbox::bind(context, "tcp://127.0.0.1:*",
                           server_options(curve_key_pair{"", "x"}, {client.public_key}), &error));
  EXPECT_TRUE(contains(error.text, "own secret key")) << error.text;
  EXPECT_FALSE(outbox::connect(
      context, "tcp://10.0.0.5:5550",
      client_options(curve_key_pair{server.public_key, client.secret_key}, server.public_key),
      &error));
  EXPECT_TRUE(contains(error.text, "does not belong")) << error.text;
  EXPECT_FALSE(
      outbox::connect(context, "tcp://10.0.0.5:5550", client_options(client, "bad"), &error));
  EXPECT_TRUE(contains(error.text, "server key")) << error.text;
  EXPECT_TRUE(outbox::connect(context, "tcp://10.0.0.5:5550",
                              client_options(client, server.public_key), &error))
      << error.text;
}

// Without a ZAP handler libzmq would admit any client holding the server key; where it supports
// ZMQ_ZAP_ENFORCE_DOMAIN the inbox refuses everyone once its authenticator has stopped.
TEST(CurveTest, InboxAdmitsNobodyAfterTheAuthenticatorStops) {
  {
    void* probe = zmq_ctx_new();
    void* socket = zmq_socket(probe, ZMQ_PULL);
    const int one = 1;
    const bool enforce_supported = zmq_setsockopt(socket, 93, &one, sizeof one) == 0;
    zmq_close(socket);
    zmq_ctx_term(probe);
    if (!enforce_supported) GTEST_SKIP() << "libzmq lacks ZMQ_ZAP_ENFORCE_DOMAIN";
  }
  const curve_key_pair client = fresh_pair();
  curve_server server(client);
  ASSERT_TRUE(server.in);
  server.authenticator->stop();
  std::optional<outbox> listed = connected_sender(
      server.context, server.in->address(), client_options(client, server.keys.public_key), 1);
  EXPECT_FALSE(server.in->receive(quiet_period));
}

}  // namespace
}  // namespace troupe::transport
