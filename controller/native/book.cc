#include "book.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace nbx {

namespace {

// calloc'd once per size it grows to: the kernel maps a large one to the shared zero
// page, so sending from it costs no memory.
class ZeroBlock {
 public:
  explicit ZeroBlock(size_t n) : p_(static_cast<uint8_t*>(std::calloc(n ? n : 1, 1))), n_(n) {
    if (p_ == nullptr) throw std::bad_alloc();
  }
  ~ZeroBlock() { std::free(p_); }
  ZeroBlock(const ZeroBlock&) = delete;
  ZeroBlock& operator=(const ZeroBlock&) = delete;
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  uint8_t* p_;
  size_t n_;
};

class ZeroBytes final : public Bytes {
 public:
  ZeroBytes(std::shared_ptr<ZeroBlock> block, size_t n) : block_(std::move(block)), n_(n) {}
  const uint8_t* data() const override { return block_->data(); }
  size_t size() const override { return n_; }

 private:
  std::shared_ptr<ZeroBlock> block_;
  size_t n_;
};

class JoinedBytes final : public Bytes {
 public:
  explicit JoinedBytes(std::vector<uint8_t> b) : b_(std::move(b)) {}
  const uint8_t* data() const override { return b_.data(); }
  size_t size() const override { return b_.size(); }

 private:
  std::vector<uint8_t> b_;
};

}  // namespace

BytesRef zeros(size_t n) {
  static std::shared_ptr<ZeroBlock> block;
  // The last few lengths asked, kept: a ring sends one segment length over and over.
  static constexpr size_t kKept = 8;
  static BytesRef kept[kKept];
  static size_t next = 0;
  if (!block || block->size() < n) {
    block = std::make_shared<ZeroBlock>(std::max(n, size_t{1} << 20));
    for (BytesRef& k : kept) k.reset();  // they hold the old block
  }
  for (const BytesRef& k : kept) {
    if (k && k->size() == n) return k;
  }
  BytesRef z = std::make_shared<ZeroBytes>(block, n);
  kept[next++ % kKept] = z;
  return z;
}

Book::Book(std::string name, uint64_t slot, std::shared_ptr<ReleaseClock> clock,
           std::shared_ptr<PayloadSource> source, std::shared_ptr<ProgramExtension> extension)
    : name_(std::move(name)),
      slot_(slot),
      clock_(std::move(clock)),
      source_(std::move(source)),
      extension_(std::move(extension)) {}

size_t Book::add_pair(int64_t real, int64_t emu) {
  pairs_.emplace_back(real, emu);
  return pairs_.size() - 1;
}

void Book::load(std::shared_ptr<const Program> program) {
  if (!pairs_.empty()) throw std::logic_error(name_ + ": a program is loaded into an empty book");
  post_window_ = program->post_window;
  for (const auto& [real, emu] : program->pairs) add_pair(real, emu);
  size_t real_sends = 0;
  std::unordered_map<int64_t, int64_t> last_step;  // real rank -> its last send's step
  for (const Program::Op& op : program->ops) {
    if (op.real_sends) {
      expect_real_send(op.pair, op.step, op.nbytes, op.limit, op.post_len);
      ++real_sends;
      int64_t& last = last_step.try_emplace(pairs_[op.pair].real, op.step).first->second;
      last = std::max(last, op.step);
    } else {
      expect(op);
    }
  }
  for (const auto& [rank, step] : last_step) {  // room for every step it sends at: no growth on the way
    if (step >= 0 && step < (int64_t{1} << 24)) received_.reserve(rank, static_cast<size_t>(step) + 1);
  }
  for (const auto& [rank, step] : last_step) {
    if (step >= 0 && step < (int64_t{1} << 24)) waiting_.reserve(rank, static_cast<size_t>(step) + 1);
  }
  programs_.push_back(std::move(program));
}

void Book::expect(const Program::Op& op) {
  PairBook& p = pairs_.at(op.pair);
  p.recvs.push_back(Expected{op.step, op.nbytes, op.limit, -1});
  p.recv_ops.push_back(&op);
  p.last_recv = op.step;
  ++boundary_;
  ++remaining_;
}

void Book::expect_real_send(size_t pair, int64_t step, int64_t nbytes, int64_t limit, int64_t post_len) {
  PairBook& p = pairs_.at(pair);
  p.sends.push_back(Expected{step, nbytes, limit, post_len});
  if (post_len >= 0) p.unposted.push_back(post_len);
  p.last_send = step;
  ++boundary_;
  ++remaining_;
}

void Book::expect_real_recv(size_t pair, int64_t step, int64_t nbytes, int64_t limit, std::vector<SendRef> deps,
                            std::vector<SendRef> content) {
  pairs_.at(pair);  // names a bad pair before anything is kept
  own_ops_.push_back(Program::Op{pair, false, step, nbytes, limit, -1, std::move(deps), std::move(content)});
  expect(own_ops_.back());
}

void Book::connect(size_t pair, Port* port, Actions& out) {
  pairs_.at(pair).port = port;
  post(pair, out);
}

void Book::post(size_t pair, Actions& out) {
  PairBook& p = pairs_.at(pair);
  if (p.port == nullptr || p.unposted.empty() || (post_window_ > 0 && p.open_posts >= post_window_)) return;
  while (!p.unposted.empty() && (post_window_ == 0 || p.open_posts < post_window_)) {  // 0: every one at once
    p.port->recv_ready(slot_, static_cast<uint64_t>(p.unposted.front()));
    p.unposted.pop_front();
    ++p.open_posts;
  }
  out.dirty.push_back(pair);
}

void Book::arrive(SendRef ref, double now, Actions& out) {
  if (!has_crossed(ref)) received_.at(ref) = zeros(0);
  wake(ref, now, out);
}

void Book::wake(SendRef ref, double now, Actions& out) {
  WaitList* list = waiting_.find(ref);
  if (list == nullptr || list->head == nullptr) return;
  Waiter* w = list->head;
  *list = WaitList{};  // taken whole: a flush below cannot add to it (its send is in)
  for (; w != nullptr; w = w->next) {
    PendingSend* s = w->send;
    if (--s->missing == 0) {
      s->inputs_at = now;
      flush(s->pair, now, out);
    }
  }
}

void Book::settle(int64_t n, double now, Actions& out) {
  remaining_ -= n;
  if (remaining_ == 0) {
    done_at_ = now;
    out.complete = true;
  }
}

BytesRef Book::received(SendRef ref) {
  const BytesRef* b = received_.find(ref);
  return b != nullptr ? *b : nullptr;
}

std::string Book::where(const PairBook& p, const std::string& what, int64_t step) const {
  std::string at = step >= 0 ? " step " + std::to_string(step) : "";
  return name_ + " rank pair " + std::to_string(p.real) + "<->" + std::to_string(p.emu) + at + ": " + what;
}

void Book::unexpected(const PairBook& p, const char* frame, uint64_t length, bool send) const {
  const int64_t last = send ? p.last_send : p.last_recv;
  std::string after = last >= 0 ? "after its last (step " + std::to_string(last) + ")" : "none at all with this peer";
  throw ProtocolFault(where(p, std::string("unexpected ") + frame + " of " + std::to_string(length) +
                                   " bytes: the schedule has no " + (send ? "send" : "recv") + " here, " + after));
}

int64_t Book::check_len(const PairBook& p, const Expected& m, uint64_t length, const char* verb) const {
  const auto n = static_cast<int64_t>(length);
  if (m.nbytes < 0) {  // a length the wire tells (a ring's last segment, pairwise messages)
    if (m.limit >= 0 && m.limit < n) {
      throw ProtocolFault(where(p, std::to_string(n) + " bytes exceed the " + std::to_string(m.limit) + " posted", m.step));
    }
    return n;
  }
  if (n != m.nbytes) {
    throw ProtocolFault(where(p, std::string("real rank ") + verb + " " + std::to_string(n) +
                                     " bytes, schedule expects " + std::to_string(m.nbytes), m.step));
  }
  return n;
}

void Book::enter(int64_t real, double now) { rank_times_.try_emplace(real, now, now); }

void Book::crossed(int64_t real, double now, Actions& out) {
  rank_times_[real].second = now;
  if (--remaining_ == 0) {
    done_at_ = now;
    out.complete = true;
  }
}

void Book::on_send_ready(size_t pair, uint64_t length, double now, Actions& out) {
  PairBook& p = pairs_.at(pair);
  enter(p.real, now);
  if (time_turnarounds_) {
    if (auto w = last_write_.find(p.real); w != last_write_.end()) turnarounds_.push_back(now - w->second);
  }
  if (p.sends.empty() && !(extension_ && extension_->extend(pair, true) && !p.sends.empty())) {
    unexpected(p, "NOTIFY_SEND_READY", length, true);
  }
  Expected posted = p.sends.front();
  p.sends.pop_front();
  const int64_t n = check_len(p, posted, length, "sends");
  p.data.push_back(Expected{posted.step, n, posted.limit, posted.post_len});
  if (posted.nbytes < 0 && posted.post_len < 0) {  // its receive waited for this notice
    p.port->recv_ready(slot_, static_cast<uint64_t>(n));
    out.dirty.push_back(pair);
  }
}

void Book::on_data(size_t pair, BytesRef payload, double now, Actions& out) {
  PairBook& p = pairs_.at(pair);
  enter(p.real, now);
  if (p.data.empty()) throw ProtocolFault(where(p, "data without a matching send notice"));
  const Expected m = p.data.front();
  p.data.pop_front();
  const auto n = static_cast<int64_t>(payload->size());
  if (n != m.nbytes) {
    throw ProtocolFault(where(p, std::to_string(n) + " data bytes, schedule expects " + std::to_string(m.nbytes), m.step));
  }
  const SendRef ref{p.real, m.step};
  received_.at(ref) = std::move(payload);
  if (clock_) clock_->real_sent(p.real, m.step, now);
  crossed(p.real, now, out);
  wake(ref, now, out);
  if (post_window_ > 0 && m.post_len >= 0) {  // a posted receive filled: the next one goes out
    --p.open_posts;
    post(pair, out);
  }
}

void Book::on_recv_ready(size_t pair, uint64_t length, double now, Actions& out) {
  PairBook& p = pairs_.at(pair);
  enter(p.real, now);
  if (p.recvs.empty() && !(extension_ && extension_->extend(pair, false) && !p.recvs.empty())) {
    unexpected(p, "NOTIFY_RECV_READY", length, false);
  }
  const Expected m = p.recvs.front();
  const int64_t n = check_len(p, m, length, "receives");
  p.recvs.pop_front();
  const Program::Op& op = *p.recv_ops.front();
  p.recv_ops.pop_front();
  PendingSend* s = &made_.emplace_back();
  s->pair = pair;
  s->step = m.step;
  s->nbytes = n;
  s->content = &op.content;
  for (const SendRef& dep : op.deps) {
    if (!has_crossed(dep)) {
      ++s->missing;
      Waiter* w = &waiters_.emplace_back(Waiter{s, nullptr});
      WaitList& list = waiting_.at(dep);
      (list.tail != nullptr ? list.tail->next : list.head) = w;
      list.tail = w;
    }
  }
  // Made on the real rank's receive notice: the notice is its first input (Gloo sends
  // only into a posted receive), so a send whose release passed before the notice came
  // waited for the real rank, not for the emulator.
  s->inputs_at = now;
  p.outq.push_back(s);
  if (s->missing == 0) flush(pair, now, out);
}

void Book::due(size_t pair, double now, Actions& out) { flush(pair, now, out); }

void Book::flush(size_t pair, double now, Actions& out) {
  PairBook& p = pairs_[pair];
  while (!p.outq.empty() && p.outq.front()->missing == 0) {
    PendingSend& s = *p.outq.front();
    if (clock_) {
      if (!s.priced) {
        s.release = clock_->release(p.emu, s.step);
        s.priced = true;
      }
      if (s.release > now) {
        if (!s.timed) {
          s.timed = true;
          out.timers.emplace_back(s.release, pair);
        }
        return;
      }
      if (s.timed) lateness_.push_back(now - s.release);
      const double held = now - std::max(s.release, s.inputs_at);
      if (!lagged_ || held > lag_) lag_ = held;
      lagged_ = true;
    }
    send(s, now, out);
    p.outq.pop_front();
  }
}

const BytesRef& Book::carried(SendRef ref) {
  const BytesRef* b = received_.find(ref);
  if (b == nullptr || !*b) throw std::out_of_range("a send's content before it crossed");
  return *b;
}

BytesRef Book::bytes_of(const std::vector<SendRef>& content, int64_t n) {
  if (content.empty()) return zeros(static_cast<size_t>(n));
  if (content.size() == 1) return carried(content[0]);
  std::vector<uint8_t> joined;  // several real sends, concatenated (a reduce's chunk)
  for (const SendRef& ref : content) {
    const BytesRef& b = carried(ref);
    joined.insert(joined.end(), b->data(), b->data() + b->size());
  }
  return std::make_shared<JoinedBytes>(std::move(joined));
}

void Book::send(PendingSend& s, double now, Actions& out) {
  PairBook& p = pairs_[s.pair];
  BytesRef payload = source_ ? source_->payload(s.pair, s.step, s.nbytes) : nullptr;
  if (!payload) payload = bytes_of(*s.content, s.nbytes);
  if (static_cast<int64_t>(payload->size()) != s.nbytes) {
    throw ProtocolFault(where(p, "forwarded " + std::to_string(payload->size()) + " bytes into a " +
                                     std::to_string(s.nbytes) + "-byte receive", s.step));
  }
  p.port->send(slot_, std::move(payload));
  ++p.sent;
  out.dirty.push_back(s.pair);
  if (time_turnarounds_) last_write_[p.real] = now;
  crossed(p.real, now, out);
}

}  // namespace nbx
