#include "gloo_pair.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace nbx::gloo {

namespace {

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // native byte order, as Gloo writes its structs
  return v;
}

void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }

bool pop_front(SlotTable<std::deque<uint64_t>>& m, uint64_t slot, uint64_t* front) {
  std::deque<uint64_t>* q = m.find(slot);
  if (q == nullptr || q->empty()) return false;
  *front = q->front();
  q->pop_front();
  return true;
}

bool take_one(SlotTable<uint64_t>& m, uint64_t slot) {
  uint64_t* n = m.find(slot);
  if (n == nullptr || *n == 0) return false;
  --*n;
  return true;
}

}  // namespace

std::string slot_hex(uint64_t slot) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(slot));
  return buf;
}

Pair::Pair(uint64_t max_payload) : max_payload_(max_payload) {}

// -- bytes in ---------------------------------------------------------------------
Pair::Window Pair::window() {
  if (payload_) return {payload_->mutable_data() + payload_have_, payload_->size() - payload_have_};
  if (skip_left_ > 0) return {scratch_.data(), std::min<size_t>(skip_left_, scratch_.size())};  // overwritten
  if (begin_ > 0 && scratch_.size() - end_ < kPreambleSize * 64) {  // a partial header at most: to the front
    std::memmove(scratch_.data(), scratch_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  return {scratch_.data() + end_, scratch_.size() - end_};
}

void Pair::commit(size_t n, std::vector<Event>& out) {
  if (skip_left_ > 0) {
    skip_left_ -= n;
    if (skip_left_ == 0) out.push_back({EventKind::kData, payload_slot_, skip_length_, nullptr});
    return;
  }
  if (payload_) {
    payload_have_ += n;
    if (payload_have_ < payload_->size()) return;
    out.push_back({EventKind::kData, payload_slot_, payload_->size(), std::move(payload_)});
    payload_.reset();
    payload_have_ = 0;
    return;
  }
  end_ += n;
  parse(out);
}

void Pair::feed(const uint8_t* p, size_t n, std::vector<Event>& out) {
  while (n > 0) {
    Window w = window();
    const size_t k = std::min(n, w.size);
    std::memcpy(w.data, p, k);
    commit(k, out);
    p += k;
    n -= k;
  }
}

void Pair::parse(std::vector<Event>& out) {
  while (end_ - begin_ >= kPreambleSize) {
    const uint8_t* h = scratch_.data() + begin_;
    const uint64_t nbytes = load_u64(h);
    const uint64_t opcode = load_u64(h + 8);
    const uint64_t slot = load_u64(h + 16);
    const uint64_t length = load_u64(h + 32);
    begin_ += kPreambleSize;
    switch (static_cast<Opcode>(opcode)) {
      case Opcode::kNotifyRecvReady:
        peer_posted_.at(slot).push_back(length);
        out.push_back({EventKind::kRecvReady, slot, length, nullptr});
        break;
      case Opcode::kNotifySendReady:
        ++peer_announced_.at(slot);
        out.push_back({EventKind::kSendReady, slot, length, nullptr});
        break;
      case Opcode::kSendUnboundBuffer:
        if (length > max_payload_ || length > UINT64_MAX - kPreambleSize || nbytes != kPreambleSize + length) {
          throw WireError("data frame nbytes=" + std::to_string(nbytes) + " does not match length=" +
                          std::to_string(length) +
                          (length > max_payload_ ? " (or exceeds the largest payload, " +
                                                       std::to_string(max_payload_) + " bytes)"
                                                 : ""));
        }
        start_payload(slot, length, out);
        if (payload_ || skip_left_ > 0) return;  // the rest of the payload is received in place (or skipped)
        break;
      default:
        throw WireError("unsupported opcode " + std::to_string(opcode) + " (bound buffers are not used by c10d)");
    }
  }
  if (begin_ == end_) begin_ = end_ = 0;
}

void Pair::start_payload(uint64_t slot, uint64_t length, std::vector<Event>& out) {
  if (!take_one(peer_announced_, slot)) {
    throw WireError("data on slot " + slot_hex(slot) + " before NOTIFY_SEND_READY");
  }
  uint64_t want;
  if (!pop_front(our_posted_, slot, &want)) {
    throw WireError("data on slot " + slot_hex(slot) + " without a posted receive");
  }
  if (length > want) {
    throw WireError(std::to_string(length) + "-byte payload on slot " + slot_hex(slot) + " exceeds the posted " +
                    std::to_string(want) + " bytes");
  }
  const size_t here = std::min<size_t>(length, end_ - begin_);
  if (discard_) {
    begin_ += here;
    if (here == length) {
      out.push_back({EventKind::kData, slot, length, nullptr});
      return;
    }
    begin_ = end_ = 0;  // everything buffered belonged to this payload; its rest is skipped
    skip_left_ = length - here;
    skip_length_ = length;
    payload_slot_ = slot;
    return;
  }
  auto payload = std::make_shared<OwnedBytes>(length);
  std::memcpy(payload->mutable_data(), scratch_.data() + begin_, here);
  begin_ += here;
  if (here == length) {
    out.push_back({EventKind::kData, slot, length, std::move(payload)});
    return;
  }
  // Everything buffered belonged to this payload; its rest goes straight into it.
  begin_ = end_ = 0;
  payload_ = std::move(payload);
  payload_have_ = here;
  payload_slot_ = slot;
}

// -- commands in, frames out ------------------------------------------------------
void Pair::header(Opcode op, uint64_t slot, uint64_t length, uint64_t nbytes) {
  uint8_t h[kPreambleSize] = {};
  store_u64(h, nbytes);
  store_u64(h + 8, static_cast<uint64_t>(op));
  store_u64(h + 16, slot);
  store_u64(h + 32, length);
  outbox_.append(h, sizeof h);
}

void Pair::send_ready(uint64_t slot, uint64_t length) {
  ++announced_.at(slot);
  header(Opcode::kNotifySendReady, slot, length, kPreambleSize);
}

void Pair::recv_ready(uint64_t slot, uint64_t length) {
  if (journal_ != nullptr) journal_->emplace_back(slot, length);
  const auto it = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) {
    return a.slot == slot && (a.guess || a.length == length);
  });
  if (it != ahead_.end()) {  // posted ahead: on the wire, and among our posted receives, already
    ahead_.erase(it);  // (a guess's keeps its open bound: the data may be in, and the book checks its length)
    return;
  }
  our_posted_.at(slot).push_back(length);
  header(Opcode::kNotifyRecvReady, slot, length, kPreambleSize);
}

void Pair::post_ahead(uint64_t slot, uint64_t length) {
  if (ahead_.size() >= kAheadKept) {  // the oldest post ahead (a guess is the core's to forget)
    const auto old = std::find_if(ahead_.begin(), ahead_.end(), [](const Ahead& a) { return !a.guess; });
    if (old != ahead_.end()) ahead_.erase(old);
  }
  our_posted_.at(slot).push_back(length);
  header(Opcode::kNotifyRecvReady, slot, length, kPreambleSize);
  ahead_.push_back({slot, length, false});
}

void Pair::post_guess(uint64_t slot, uint64_t length) {
  our_posted_.at(slot).push_back(max_payload_);
  header(Opcode::kNotifyRecvReady, slot, length, kPreambleSize);
  ahead_.push_back({slot, length, true});
}

bool Pair::has_guess(uint64_t slot) const {
  return std::any_of(ahead_.begin(), ahead_.end(), [&](const Ahead& a) { return a.guess && a.slot == slot; });
}

bool Pair::forget_guess(uint64_t slot) {
  const auto it = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) { return a.guess && a.slot == slot; });
  if (it == ahead_.end()) return false;
  ahead_.erase(it);
  std::deque<uint64_t>* posted = our_posted_.find(slot);
  if (posted != nullptr) {
    const auto mine = std::find(posted->begin(), posted->end(), max_payload_);
    if (mine != posted->end()) posted->erase(mine);
  }
  return true;
}

size_t Pair::guesses() const {
  return static_cast<size_t>(std::count_if(ahead_.begin(), ahead_.end(), [](const Ahead& a) { return a.guess; }));
}

void Pair::data(uint64_t slot, BytesRef payload) {
  const uint64_t n = payload->size();
  uint64_t* ann = announced_.find(slot);
  if (ann == nullptr || *ann == 0) {
    throw WireError("data on slot " + slot_hex(slot) + " before NOTIFY_SEND_READY");
  }
  std::deque<uint64_t>* posted = peer_posted_.find(slot);
  if (posted == nullptr || posted->empty()) {
    throw WireError("data on slot " + slot_hex(slot) + " before the peer's NOTIFY_RECV_READY");
  }
  if (n > posted->front()) {
    throw WireError(std::to_string(n) + "-byte payload on slot " + slot_hex(slot) + " exceeds the peer's " +
                    std::to_string(posted->front()));
  }
  posted->pop_front();
  --*ann;
  header(Opcode::kSendUnboundBuffer, slot, n, kPreambleSize + n);
  outbox_.append(std::move(payload));
}

void Pair::send(uint64_t slot, BytesRef payload) {
  send_ready(slot, payload->size());
  data(slot, std::move(payload));
}

}  // namespace nbx::gloo
