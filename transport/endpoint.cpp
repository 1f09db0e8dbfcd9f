#include "transport/endpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include <zmq.hpp>

namespace troupe::transport {
namespace {

// Messages one inbox may hand over before the receiver thread looks at the others again.
constexpr int drain_batch = 64;

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// The tcp base port of "tcp://host:port", or -1 when there is none.
long tcp_base_port(const std::string& prefix) {
  const size_t colon = prefix.rfind(':');
  if (colon == std::string::npos || colon < 6 || colon + 1 == prefix.size()) return -1;
  const std::string digits = prefix.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stol(digits);
}

// ZeroMQ calls this once it no longer needs a zero-copy payload, on whichever thread drops the
// last reference (an I/O thread, or the receiver's).
void release_owner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t zero_copy_part(const frame& payload) {
  if (payload.bytes == 0) return zmq::message_t();
  if (!payload.owner) return zmq::message_t(payload.data, payload.bytes);
  auto* hint = new std::shared_ptr<const void>(payload.owner);
  try {
    // ZeroMQ never writes through a message it sends, so handing it const data is safe.
    return zmq::message_t(const_cast<void*>(payload.data), payload.bytes, &release_owner, hint);
  } catch (...) {
    delete hint;
    throw;
  }
}

frame received_frame(std::shared_ptr<zmq::message_t> part) {
  const void* data = part->data();
  const size_t bytes = part->size();
  return frame{std::shared_ptr<const void>(std::move(part), data), data, bytes};
}

// ZeroMQ's "Peer-Address" metadata: the sender's IP over tcp; other transports have none.
std::string peer_address(zmq::message_t& part) {
  try {
    const char* address = part.gets("Peer-Address");
    return address ? address : "";
  } catch (const zmq::error_t&) {
    return "";
  }
}

decode_result rejected(decode_error_reason reason, std::string text) {
  return decode_result{std::nullopt, decode_error{reason, std::move(text), {}}};
}

void apply_common_options(zmq::socket_t& socket, const endpoint_options& options) {
  socket.set(zmq::sockopt::linger, options.linger_ms);
  socket.set(zmq::sockopt::sndhwm, options.send_high_water_mark);
  socket.set(zmq::sockopt::rcvhwm, options.receive_high_water_mark);
}

[[noreturn]] void fail(const char* what, const zmq::error_t& error) {
  std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, what, error.what());
  std::abort();
}

}  // namespace

std::string inproc_prefix(uint64_t job_id) { return "inproc://troupe-" + std::to_string(job_id); }

std::string stage_address(const std::string& prefix, int stage) {
  if (stage < 0) return "";
  if (starts_with(prefix, "inproc://") || starts_with(prefix, "ipc://")) {
    return prefix + "/stage-" + std::to_string(stage);
  }
  if (!starts_with(prefix, "tcp://")) return "";
  const long base = tcp_base_port(prefix);
  if (base < 0 || base + stage > 65535) return "";
  return prefix.substr(0, prefix.rfind(':') + 1) + std::to_string(base + stage);
}

const char* to_string(send_status status) {
  switch (status) {
    case send_status::sent:
      return "sent";
    case send_status::would_block:
      return "would_block";
    case send_status::invalid_message:
      return "invalid_message";
    case send_status::failed:
      return "failed";
  }
  return "unknown";
}

transport_context::transport_context(int io_threads)
    : context_(std::make_unique<zmq::context_t>(io_threads)) {}

transport_context::~transport_context() = default;

// ---- outbox ----

outbox::outbox(std::unique_ptr<zmq::socket_t> socket, std::string address, endpoint_options options)
    : socket_(std::move(socket)), address_(std::move(address)), options_(options) {}

outbox::outbox(outbox&& other) noexcept = default;
outbox& outbox::operator=(outbox&& other) noexcept = default;
outbox::~outbox() = default;

std::optional<outbox> outbox::connect(transport_context& context, const std::string& address,
                                      const endpoint_options& options, endpoint_error* error) {
  try {
    auto socket = std::make_unique<zmq::socket_t>(*context.context_, zmq::socket_type::push);
    apply_common_options(*socket, options);
    if (auto refusal =
            secure_socket(context, *socket, address, options.security, endpoint_role::outbox)) {
      if (error != nullptr) error->text = *refusal;
      return std::nullopt;
    }
    socket->connect(address);
    return outbox(std::move(socket), address, options);
  } catch (const zmq::error_t& failure) {
    if (error != nullptr) error->text = "cannot connect to '" + address + "': " + failure.what();
    return std::nullopt;
  }
}

send_result outbox::send(const message& outgoing) {
  if (!socket_) return {send_status::failed, "outbox was moved from"};
  if (auto failure = validate_message(outgoing, options_.limits)) {
    return {send_status::invalid_message, failure->text};
  }
  const std::vector<uint8_t> header = encode_header(outgoing.header);
  if (header.size() > options_.limits.max_header_bytes) {
    return {send_status::invalid_message,
            "header of " + std::to_string(header.size()) + " bytes is over the limit"};
  }
  try {
    return send_parts(header, outgoing.payloads);
  } catch (const zmq::error_t& failure) {
    if (failure.num() == EINTR) return {send_status::would_block, "interrupted"};
    return {send_status::failed, "send to '" + address_ + "': " + failure.what()};
  }
}

// ZeroMQ checks the high-water mark on the first part only; the other parts of an accepted
// message always follow it, or the whole message is rolled back.
send_result outbox::send_parts(const std::vector<uint8_t>& header,
                               const std::vector<frame>& payloads) {
  const auto more = zmq::send_flags::dontwait | zmq::send_flags::sndmore;
  zmq::message_t head(header.data(), header.size());
  if (!socket_->send(head, payloads.empty() ? zmq::send_flags::dontwait : more)) {
    return {send_status::would_block, "high-water mark of '" + address_ + "' reached"};
  }
  for (size_t i = 0; i < payloads.size(); ++i) {
    zmq::message_t part = zero_copy_part(payloads[i]);
    const bool last = i + 1 == payloads.size();
    if (!socket_->send(part, last ? zmq::send_flags::dontwait : more)) {
      return {send_status::would_block, "message to '" + address_ + "' rolled back"};
    }
  }
  return {send_status::sent, ""};
}

send_result outbox::send_waiting(const message& outgoing, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  send_result result = send(outgoing);
  while (result.status == send_status::would_block) {
    std::chrono::milliseconds wait = std::chrono::milliseconds(100);
    if (timeout.count() >= 0) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return result;
      wait = std::min(wait, left);
    }
    wait_writable(wait);
    result = send(outgoing);
  }
  return result;
}

bool outbox::wait_writable(std::chrono::milliseconds timeout) {
  if (!socket_) return false;
  zmq_pollitem_t item{socket_->handle(), 0, ZMQ_POLLOUT, 0};
  try {
    return zmq::poll(&item, 1, timeout) > 0 && (item.revents & ZMQ_POLLOUT) != 0;
  } catch (const zmq::error_t&) {
    return false;
  }
}

// ---- inbox ----

inbox::inbox(std::unique_ptr<zmq::socket_t> socket, std::string address, endpoint_options options)
    : socket_(std::move(socket)), address_(std::move(address)), options_(options) {}

inbox::inbox(inbox&& other) noexcept = default;
inbox& inbox::operator=(inbox&& other) noexcept = default;
inbox::~inbox() = default;

std::optional<inbox> inbox::bind(transport_context& context, const std::string& address,
                                 const endpoint_options& options, endpoint_error* error) {
  try {
    auto socket = std::make_unique<zmq::socket_t>(*context.context_, zmq::socket_type::pull);
    apply_common_options(*socket, options);
    // Network peers announcing a part larger than any valid one are cut off before ZeroMQ
    // allocates it (inproc parts are already in memory and are checked by decode_message).
    const uint64_t largest =
        std::max<uint64_t>(options.limits.max_payload_bytes, options.limits.max_header_bytes);
    socket->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(largest));
    if (auto refusal =
            secure_socket(context, *socket, address, options.security, endpoint_role::inbox)) {
      if (error != nullptr) error->text = *refusal;
      return std::nullopt;
    }
    socket->bind(address);
    std::string bound = socket->get(zmq::sockopt::last_endpoint);
    return inbox(std::move(socket), bound.empty() ? address : bound, options);
  } catch (const zmq::error_t& failure) {
    if (error != nullptr) error->text = "cannot bind '" + address + "': " + failure.what();
    return std::nullopt;
  }
}

// zmq_poll can report POLLIN with nothing to receive: on a CURVE connection whose ZAP reply
// names a user id, libzmq queues a "credential" item ahead of the first message, which counts
// as readable but is skipped by recv; if that first message has several parts and its last part
// is still on the wire, recv finds nothing. So an empty try_receive() means "poll again until
// the deadline", not "timed out".
std::optional<decode_result> inbox::receive(std::chrono::milliseconds timeout) {
  if (!socket_) return std::nullopt;
  // A message already queued needs no poll (a system call); streams mostly find one waiting.
  if (std::optional<decode_result> waiting = try_receive()) return waiting;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  zmq_pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
  for (std::chrono::milliseconds left = timeout;;) {
    try {
      if (zmq::poll(&item, 1, left) <= 0) return std::nullopt;
    } catch (const zmq::error_t&) {
      return std::nullopt;
    }
    if (std::optional<decode_result> received = try_receive()) return received;
    if (timeout.count() < 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
  }
}

// The parts of one message arrive together, so after the first one the rest are already here.
std::optional<decode_result> inbox::try_receive() {
  if (!socket_) return std::nullopt;
  try {
    zmq::message_t head;
    if (!socket_->recv(head, zmq::recv_flags::dontwait)) return std::nullopt;
    std::vector<frame> payloads;
    size_t discarded = 0;
    for (bool more = head.more(); more;) {
      auto part = std::make_shared<zmq::message_t>();
      if (!socket_->recv(*part, zmq::recv_flags::dontwait)) break;
      more = part->more();
      if (payloads.size() < options_.limits.max_frames) {
        payloads.push_back(received_frame(std::move(part)));
      } else {
        ++discarded;
      }
    }
    decode_result result = discarded != 0 ? rejected(decode_error_reason::oversized,
                                                     std::to_string(payloads.size() + discarded) +
                                                         " payload frames; the limit is " +
                                                         std::to_string(options_.limits.max_frames))
                                          : decode_message(head.data(), head.size(),
                                                           std::move(payloads), options_.limits);
    if (!result.ok()) result.error.peer = peer_address(head);
    return result;
  } catch (const zmq::error_t&) {
    return std::nullopt;
  }
}

// ---- receiver_thread ----

receiver_thread::receiver_thread(transport_context& context, std::vector<inbox> inboxes,
                                 message_handler on_message, drop_handler on_drop)
    : inboxes_(std::move(inboxes)),
      on_message_(std::move(on_message)),
      on_drop_(std::move(on_drop)) {
  static std::atomic<uint64_t> next_wake_id{0};
  const std::string wake_address =
      "inproc://troupe-receiver-wake-" + std::to_string(next_wake_id.fetch_add(1));
  try {
    wake_receiver_ = std::make_unique<zmq::socket_t>(*context.context_, zmq::socket_type::pair);
    wake_receiver_->set(zmq::sockopt::linger, 0);
    wake_receiver_->bind(wake_address);
    wake_sender_ = std::make_unique<zmq::socket_t>(*context.context_, zmq::socket_type::pair);
    wake_sender_->set(zmq::sockopt::linger, 0);
    wake_sender_->connect(wake_address);
  } catch (const zmq::error_t& failure) {
    // Only resource exhaustion makes an inproc pair on a live context fail.
    fail("receiver_thread cannot create its wake-up socket", failure);
  }
  thread_ = std::thread([this] { run(); });
}

receiver_thread::~receiver_thread() { stop(); }

void receiver_thread::stop() {
  std::lock_guard<std::mutex> lock(stop_mutex_);
  if (!thread_.joinable()) return;
  if (std::this_thread::get_id() == thread_.get_id()) {
    std::fprintf(stderr, "%s:%d: receiver_thread::stop() called from its own callback\n", __FILE__,
                 __LINE__);
    std::abort();
  }
  try {
    wake_sender_->send(zmq::message_t(), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& failure) {
    fail("receiver_thread cannot wake its thread", failure);
  }
  thread_.join();
}

void receiver_thread::run() {
  std::vector<zmq_pollitem_t> items;
  items.push_back(zmq_pollitem_t{wake_receiver_->handle(), 0, ZMQ_POLLIN, 0});
  for (inbox& source : inboxes_) {
    items.push_back(zmq_pollitem_t{source.socket_->handle(), 0, ZMQ_POLLIN, 0});
  }
  while (true) {
    try {
      zmq::poll(items, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& failure) {
      if (failure.num() == EINTR) continue;
      return;  // the context is terminating
    }
    if ((items[0].revents & ZMQ_POLLIN) != 0) return;
    for (size_t i = 1; i < items.size(); ++i) {
      if ((items[i].revents & ZMQ_POLLIN) != 0) drain(inboxes_[i - 1]);
    }
  }
}

void receiver_thread::drain(inbox& source) {
  for (int i = 0; i < drain_batch; ++i) {
    std::optional<decode_result> received = source.try_receive();
    if (!received) return;
    if (received->ok()) {
      delivered_.fetch_add(1);
      if (on_message_) on_message_(std::move(*received->value));
    } else {
      dropped_.fetch_add(1);
      if (on_drop_) on_drop_(source.address(), received->error);
    }
  }
}

}  // namespace troupe::transport
