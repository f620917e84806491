// The boundary bookkeeping of one collective instance, as a sans-IO machine.
//
// A collective's schedule says, for every (real, emulated) pair, which messages cross
// the boundary and in which order; the book holds that program and follows it:
//   - frame matching: each notice and payload of a real rank against the message its
//     schedule has next on that pair (FIFO per pair, as the library matches);
//   - dependencies: an emulated rank's send waits for the real sends it builds on
//     (the bitmap of what crossed: `received_`);
//   - the FIFO of ready sends per pair, in the order the real rank posted its
//     receives, each held until its release time;
//   - accounting: what is left to cross, each real rank's first and last time.
// Time comes in as an argument; frames go out through each pair's Port, and the
// timers and flushes it needs go out as Actions for its driver. It knows no
// library's frames (port.h) and no delay model: release times come from a
// ReleaseClock, asked once per emulated message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bytes.h"
#include "port.h"

namespace nbx {

// A frame the schedule does not have: the message names the instance, the pair and the step.
class ProtocolFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A real rank's send: (group rank, step).
struct SendRef {
  int64_t rank;
  int64_t step;
  uint64_t key() const { return (static_cast<uint64_t>(rank) << 32) ^ static_cast<uint32_t>(step); }
};

// When each emulated message may leave (the schedules' timing model, priced by the
// delay model): asked once per message; told when each real send crossed.
class ReleaseClock {
 public:
  virtual ~ReleaseClock() = default;
  virtual double release(int64_t emu, int64_t step) = 0;
  virtual void real_sent(int64_t real, int64_t step, double t) = 0;
};

// Where an emulated send's bytes come from when the book's own rule (zeros, or the
// real sends it carries) is not the policy: a mirrored input folded in, an object's
// pickle. Returns null to fall back to the book's rule.
class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  virtual BytesRef payload(size_t pair, int64_t step, int64_t nbytes) = 0;
};

// Told of a notice on a pair whose program has nothing left in that direction; may
// add to the program (a reduce's gather, once a frame names its root) and return true.
class ProgramExtension {
 public:
  virtual ~ProgramExtension() = default;
  virtual bool extend(size_t pair, bool send) = 0;
};

// Something per real send, by SendRef: each real rank's sends by step, densely (a rank's
// steps run from 0 up), so a lookup is two indexings and a book's end frees no node per
// message. What crossed, and the sends waiting for what has not.
template <class T>
class SendTable {
 public:
  void reserve(int64_t rank, size_t steps) { row(rank).reserve(steps); }
  // The entry, made (empty) if there is none.
  T& at(SendRef ref) {
    if (ref.step < 0 || ref.step >= kDenseSteps) return sparse_[ref.key()];
    std::vector<T>& r = row(ref.rank);
    const auto i = static_cast<size_t>(ref.step);
    if (r.size() <= i) r.resize(i + 1);
    return r[i];
  }
  // The entry, or null where none was made.
  T* find(SendRef ref) {
    if (ref.step < 0 || ref.step >= kDenseSteps) {
      auto it = sparse_.find(ref.key());
      return it == sparse_.end() ? nullptr : &it->second;
    }
    std::vector<T>* r = last_ != nullptr && last_rank_ == ref.rank ? last_ : nullptr;
    if (r == nullptr) {
      auto it = by_rank_.find(ref.rank);
      if (it == by_rank_.end()) return nullptr;
      r = &it->second;
    }
    const auto i = static_cast<size_t>(ref.step);
    return i < r->size() ? &(*r)[i] : nullptr;
  }
  // f(entry) for every entry made, in no particular order.
  template <class F>
  void for_each(F f) const {
    for (const auto& [rank, row] : by_rank_) {
      for (const T& v : row) f(v);
    }
    for (const auto& [key, v] : sparse_) f(v);
  }

 private:
  static constexpr int64_t kDenseSteps = int64_t{1} << 24;  // past this (or below 0), a map
  std::vector<T>& row(int64_t rank) {
    if (last_ != nullptr && last_rank_ == rank) return *last_;
    last_rank_ = rank;
    return *(last_ = &by_rank_[rank]);
  }

  std::unordered_map<int64_t, std::vector<T>> by_rank_;  // nodes never move
  std::unordered_map<uint64_t, T> sparse_;
  int64_t last_rank_ = 0;
  std::vector<T>* last_ = nullptr;  // by_rank_[last_rank_], the row asked last
};

// What one call asks of its driver.
struct Actions {
  std::vector<std::pair<double, size_t>> timers;  // (when, pair): call due(pair, t) then
  std::vector<size_t> dirty;                      // pairs with frames queued
  bool complete = false;                          // every boundary message crossed
};

// A boundary program as the schedule gives it, recorded once per shape and loaded
// into each instance of that shape (`Book::load`): DDP repeats its buckets every step,
// so steady state builds no program from Python.
struct Program {
  struct Op {
    size_t pair;
    bool real_sends;  // expect_real_send, else expect_real_recv
    int64_t step, nbytes, limit, post_len;
    std::vector<SendRef> deps, content;  // a receive's
  };
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (real, emu), by index
  std::vector<Op> ops;                              // in program order per pair
  // Receives the emulated side keeps posted per pair, the next as data fills one (0: all
  // at once). Gloo's ring posts two steps ahead; a peer that posts them all makes the real
  // rank write every send in place, under its pair's lock (docs/benchmarks.md).
  int64_t post_window = 0;
};

class Book {
 public:
  Book(std::string name, uint64_t slot, std::shared_ptr<ReleaseClock> clock,
       std::shared_ptr<PayloadSource> source = nullptr, std::shared_ptr<ProgramExtension> extension = nullptr);

  // -- the program (before the first event) ---------------------------------------
  size_t add_pair(int64_t real, int64_t emu);
  // Every pair and message of `program`, into a book that has none yet (its pair i is
  // the program's pair i). The book keeps the program: its receives' dependencies and
  // contents are read from it, not copied.
  void load(std::shared_ptr<const Program> program);
  // The real rank sends `nbytes` (< 0: the wire tells, at most `limit`) at `step`;
  // the emulated side posts a receive of `post_len` (< 0: when the notice tells).
  void expect_real_send(size_t pair, int64_t step, int64_t nbytes, int64_t limit, int64_t post_len);
  // The real rank receives from the emulated peer at `step`; the peer's send waits for
  // `deps` and carries the bytes of `content` concatenated (none: zeros).
  void expect_real_recv(size_t pair, int64_t step, int64_t nbytes, int64_t limit, std::vector<SendRef> deps,
                        std::vector<SendRef> content);
  // The pair's connection is open: its receives are posted now (and from now on, as
  // the program grows).
  void connect(size_t pair, Port* port, Actions& out);
  // Post the receives the program gained since the last post, on a connected pair.
  void post(size_t pair, Actions& out);
  // Something sends wait on that is not a boundary message (a mirrored input: rank -1)
  // is in.
  void arrive(SendRef ref, double now, Actions& out);
  // Placeholders: `n` more to settle before the instance is done (a reduce's gather
  // before its root is known), and `n` of them settled.
  void hold(int64_t n) { remaining_ += n; }
  void settle(int64_t n, double now, Actions& out);

  // -- events -----------------------------------------------------------------------
  void on_send_ready(size_t pair, uint64_t length, double now, Actions& out);
  void on_data(size_t pair, BytesRef payload, double now, Actions& out);
  void on_recv_ready(size_t pair, uint64_t length, double now, Actions& out);
  void due(size_t pair, double now, Actions& out);  // a timer asked for by `out.timers` fired

  // -- state --------------------------------------------------------------------------
  uint64_t slot() const { return slot_; }
  size_t pairs() const { return pairs_.size(); }
  int64_t real_of(size_t pair) const { return pairs_[pair].real; }
  int64_t emu_of(size_t pair) const { return pairs_[pair].emu; }
  int64_t boundary() const { return boundary_; }
  int64_t remaining() const { return remaining_; }
  // Whether the emulated sends on `pair` are all out, and there were some: none queued, no
  // receive of the real rank's still to come that one would fill.
  bool sends_out(size_t pair) const {
    const PairBook& p = pairs_.at(pair);
    return p.sent > 0 && p.recvs.empty() && p.outq.empty();
  }
  bool done() const { return remaining_ == 0; }
  double done_at() const { return done_at_; }
  // The payload of a real send that crossed (null: not yet).
  BytesRef received(SendRef ref);
  // Real rank -> (first frame, last message crossed).
  const std::unordered_map<int64_t, std::pair<double, double>>& rank_times() const { return rank_times_; }
  std::vector<double> take_lateness() { return std::move(lateness_); }
  // The emulator's lag: how far past both its modeled release and its last input (the
  // real rank's receive notice, the real sends it carries) the latest priced send left: a
  // send whose inputs came after its release waited for the real rank, not for the
  // emulator. Negative: none was late. Meaningless until `lagged()`.
  double lag() const { return lag_; }
  bool lagged() const { return lagged_; }
  // The real ranks' turnarounds: for each of their send notices, how long after this
  // book's latest write to the same rank it came (its receive, its own work, its call to
  // send). Immune to when the emulated side released: the meter of local work reads it.
  // Timed only when asked (a run that measures its local work): nothing per message else.
  void time_turnarounds() { time_turnarounds_ = true; }
  std::vector<double> take_turnarounds() { return std::move(turnarounds_); }
  // The instance is over: let go of the hooks (they hold its Python side).
  void drop_hooks() {
    source_.reset();
    extension_.reset();
  }
  // ... and of the bytes that crossed: only the times are read from here on (at its
  // completion, every send is out). A finished instance's record may wait for the loop's
  // idle turn, and a book started natively for Python's adoption, up to 64 of each:
  // holding their payloads (256 MiB at 4 MiB allreduces) made every new instance fault in
  // fresh pages.
  void drop_payloads() { received_ = SendTable<BytesRef>(); }
  // Bytes of the real sends it still holds (0 once it completed or closed).
  size_t held_bytes() const {
    size_t n = 0;
    received_.for_each([&n](const BytesRef& b) { n += b ? b->size() : 0; });
    return n;
  }

 private:
  struct Expected {
    int64_t step, nbytes, limit, post_len;
  };
  struct PendingSend {
    size_t pair;
    int64_t step, nbytes;
    const std::vector<SendRef>* content;  // in a program's op (loaded, or the book's own)
    int missing = 0;
    bool timed = false, priced = false;
    double release = 0.0;
    double inputs_at = 0.0;  // when its last input came: the receive notice that made it, or a real send
  };
  struct PairBook {
    PairBook(int64_t r, int64_t e) : real(r), emu(e) {}
    int64_t real, emu;
    Port* port = nullptr;
    std::deque<Expected> sends, data, recvs;      // the real rank's, still to come
    std::deque<int64_t> unposted;                 // receive lengths the emulated side has yet to post
    int64_t open_posts = 0;                       // posted, their data not in yet (under a post window)
    std::deque<const Program::Op*> recv_ops;      // beside `recvs`: their deps and contents
    int64_t last_send = -1, last_recv = -1;       // steps, for the error text
    std::deque<PendingSend*> outq;                // the emulated sends, in posting order (in `made_`)
    int64_t sent = 0;                             // emulated sends written
  };

  std::string where(const PairBook& p, const std::string& what, int64_t step = -1) const;
  [[noreturn]] void unexpected(const PairBook& p, const char* frame, uint64_t length, bool send) const;
  int64_t check_len(const PairBook& p, const Expected& m, uint64_t length, const char* verb) const;
  void expect(const Program::Op& op);  // a receive of the real rank's, its op kept in place
  void enter(int64_t real, double now);
  void wake(SendRef ref, double now, Actions& out);  // frees the sends that waited on `ref`
  bool has_crossed(SendRef ref) {
    const BytesRef* b = received_.find(ref);
    return b != nullptr && *b;
  }
  void crossed(int64_t real, double now, Actions& out);
  void flush(size_t pair, double now, Actions& out);
  void send(PendingSend& p, double now, Actions& out);
  BytesRef bytes_of(const std::vector<SendRef>& content, int64_t n);
  const BytesRef& carried(SendRef ref);  // what a real send carried (it crossed)

  std::string name_;
  uint64_t slot_;
  int64_t post_window_ = 0;  // the first program's (Program::post_window)
  std::shared_ptr<ReleaseClock> clock_;
  std::shared_ptr<PayloadSource> source_;
  std::shared_ptr<ProgramExtension> extension_;
  std::deque<PairBook> pairs_;  // a deque: a PairBook never moves
  std::vector<std::shared_ptr<const Program>> programs_;  // loaded: their ops are read in place
  std::deque<Program::Op> own_ops_;  // receives added one by one (expect_real_recv); never move
  std::deque<PendingSend> made_;     // every emulated send made; never move
  struct Waiter {  // one send waiting for one real send, in the order they came
    PendingSend* send;
    Waiter* next;
  };
  struct WaitList {
    Waiter* head = nullptr;
    Waiter* tail = nullptr;
  };
  std::deque<Waiter> waiters_;  // never move
  SendTable<BytesRef> received_;  // what crossed (null: not yet), by SendRef
  SendTable<WaitList> waiting_;    // real send -> the sends it feeds, not yet in
  std::unordered_map<int64_t, std::pair<double, double>> rank_times_;
  std::vector<double> lateness_;
  std::unordered_map<int64_t, double> last_write_;  // real rank -> this book's latest write to it
  std::vector<double> turnarounds_;
  bool time_turnarounds_ = false;
  double lag_ = 0;
  bool lagged_ = false;
  int64_t boundary_ = 0, remaining_ = 0;
  double done_at_ = 0.0;
};

// Zeros of any length, from one shared block (an emulated rank's own contribution).
BytesRef zeros(size_t n);

}  // namespace nbx
