// One Gloo TCP pair seen from the controller's side, as a sans-IO state machine.
//
// Bytes in, events out; commands in, frames out (into the pair's Outbox). It enforces
// the rules the real side would kill the pair for (docs/wire.md, "Frames"): no data on
// a slot before the peer's NOTIFY_RECV_READY, FIFO matching per slot, no payload
// longer than the posted receive, NOTIFY_SEND_READY before data. Every check runs on
// the 48-byte header, before a payload's bytes are buffered, and a payload is never
// larger than a receive this side posted (or `max_payload`), so nothing the peer sends
// can make it buffer without bound.
//
// Bytes in come in two ways. `window()` says where the next received bytes belong and
// `commit(n)` says that `n` of them came: a large payload is received straight into
// the buffer it will be forwarded from. `feed()` copies bytes in through the same
// windows (tests, the virtual-time driver).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "bytes.h"
#include "outbox.h"
#include "port.h"

namespace nbx::gloo {

constexpr size_t kPreambleSize = 48;  // six native u64: nbytes opcode slot offset length roffset
constexpr uint64_t kNoPayloadBound = uint64_t{1} << 40;  // max_payload where the posted receive is the bound

enum class Opcode : uint64_t {
  kSendBuffer = 0,
  kSendUnboundBuffer = 1,
  kNotifySendReady = 2,
  kNotifyRecvReady = 3,
};

// A frame that breaks the Gloo protocol, from either side.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class EventKind : uint8_t { kRecvReady, kSendReady, kData };

struct Event {
  EventKind kind;
  uint64_t slot;
  uint64_t length;
  std::shared_ptr<OwnedBytes> payload;  // kData only
};

// Per-slot state of a pair. A slot is busy for one collective and then done with, and a
// pair serves one or a few at a time: the last slot asked is kept at hand, and entries
// left idle (nothing queued, nothing counted) are swept once there are more than a few,
// so a busy slot's state is not freed and made again with every message.
template <class V>
class SlotTable {
 public:
  static constexpr size_t kSweepAt = 32;

  V* find(uint64_t slot) {
    if (last_ != nullptr && last_slot_ == slot) return last_;
    auto it = map_.find(slot);
    if (it == map_.end()) return nullptr;
    last_slot_ = slot;
    return last_ = &it->second;
  }
  V& at(uint64_t slot) {
    if (V* v = find(slot)) return *v;
    if (map_.size() >= sweep_at_) sweep();
    last_slot_ = slot;
    return *(last_ = &map_[slot]);
  }
  size_t size() const { return map_.size(); }

 private:
  static bool idle(const std::deque<uint64_t>& q) { return q.empty(); }
  static bool idle(uint64_t n) { return n == 0; }
  void sweep() {  // amortized: the next sweep waits for the table to double
    for (auto it = map_.begin(); it != map_.end();) it = idle(it->second) ? map_.erase(it) : std::next(it);
    last_ = nullptr;
    sweep_at_ = std::max(kSweepAt, 2 * map_.size());
  }

  std::unordered_map<uint64_t, V> map_;  // nodes never move: `last_` stays valid until a sweep
  uint64_t last_slot_ = 0;
  V* last_ = nullptr;
  size_t sweep_at_ = kSweepAt;
};

// The Gloo pair is the Port the collective book (book.h) commands.
class Pair final : public Port {
 public:
  static constexpr size_t kScratchSize = 64 * 1024;

  explicit Pair(uint64_t max_payload);

  // Payloads are checked and counted, not kept: their Data events carry no bytes. For a
  // side that reads nothing from them (the simulated rank of the virtual-time driver).
  void discard_payloads() { discard_ = true; }

  // -- bytes in, events out ------------------------------------------------
  struct Window {
    uint8_t* data;
    size_t size;
  };
  Window window();
  void commit(size_t n, std::vector<Event>& out);
  void feed(const uint8_t* p, size_t n, std::vector<Event>& out);

  // -- commands in, frames out ---------------------------------------------
  void send_ready(uint64_t slot, uint64_t length);
  void recv_ready(uint64_t slot, uint64_t length) override;
  // A receive posted ahead of the book that will post it (the core's native start, while it
  // waits for the rest of the notices that settle an allgather): that book's recv_ready of
  // the same slot and length then sends nothing, the notice being on the wire already.
  void post_ahead(uint64_t slot, uint64_t length);
  // A receive posted on a guess: the next instance of a repeating shape will post it (the
  // core's plan, book_bindings.cc "Guesses"). Gloo's pair counts a peer's receive notices per
  // slot with no length, so the real rank's send on that slot then goes at once, from its own
  // thread. Kept with no bound of its own (`max_payload`): a guess right about the slot and
  // wrong about the length still takes the data, whose length the book then checks. The
  // next recv_ready of the slot, whatever its length, sends nothing.
  void post_guess(uint64_t slot, uint64_t length);
  // Whether a guess of `slot` is still unclaimed (no recv_ready has taken it).
  bool has_guess(uint64_t slot) const;
  // Forgets an unclaimed guess of `slot` (its tag long passed, no data came): its posted
  // receive goes with it. False if there was none.
  bool forget_guess(uint64_t slot);
  size_t guesses() const;
  // recv_ready's (slot, length), each appended here while set: what a book posts as it connects.
  void set_journal(std::vector<std::pair<uint64_t, uint64_t>>* journal) { journal_ = journal; }
  void data(uint64_t slot, BytesRef payload);
  void send(uint64_t slot, BytesRef payload) override;  // NOTIFY_SEND_READY and the data, as Gloo sends them
  Outbox& outbox() { return outbox_; }

  // Bytes held for frames not yet complete (a partial header, a payload being received).
  size_t buffered() const { return (end_ - begin_) + (payload_ ? payload_->size() : 0); }

 private:
  void parse(std::vector<Event>& out);
  void start_payload(uint64_t slot, uint64_t length, std::vector<Event>& out);
  void header(Opcode op, uint64_t slot, uint64_t length, uint64_t nbytes);

  uint64_t max_payload_;
  // Headers and small payloads. Not zeroed: only bytes received are read, and a pair
  // that carries little (one of thousands a pairwise collective opens) touches a page of it.
  struct Scratch {
    std::unique_ptr<uint8_t[]> bytes{new uint8_t[kScratchSize]};
    uint8_t* data() { return bytes.get(); }
    static constexpr size_t size() { return kScratchSize; }
  } scratch_;
  size_t begin_ = 0, end_ = 0;    // unparsed bytes of scratch_
  std::shared_ptr<OwnedBytes> payload_;  // a data frame's payload being received
  size_t payload_have_ = 0;
  uint64_t payload_slot_ = 0;
  bool discard_ = false;
  uint64_t skip_left_ = 0;  // bytes of a discarded payload still to come
  uint64_t skip_length_ = 0;

  SlotTable<std::deque<uint64_t>> peer_posted_;  // receives the peer posted
  SlotTable<uint64_t> announced_;                // our send notices awaiting data
  SlotTable<std::deque<uint64_t>> our_posted_;   // receives we posted
  SlotTable<uint64_t> peer_announced_;           // peer's send notices awaiting data
  static constexpr size_t kAheadKept = 64;       // posts ahead no book claimed (its instance went elsewhere)
  struct Ahead {
    uint64_t slot, length;
    bool guess;  // post_guess: any length claims it
  };
  std::vector<Ahead> ahead_;  // posted ahead, oldest first
  std::vector<std::pair<uint64_t, uint64_t>>* journal_ = nullptr;
  Outbox outbox_;
};

std::string slot_hex(uint64_t slot);

}  // namespace nbx::gloo
