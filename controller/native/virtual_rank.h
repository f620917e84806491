// The real rank of a simulation, played punctually from its schedule: one instance's
// side of it, as a sans-IO machine with no clock and no Python.
//
// It is what the virtual-time driver (virtual_wire.cc) runs in place of a stock Gloo
// rank: every receive is posted and every send announced at entry, and a step's send
// leaves once the receives it waits for are in and worked on, as an emulated rank's
// would (a ring's send waits for the receives up to two steps back, a tree's or a
// barrier's for those before it, a pairwise collective's for none).
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace nbx::sim {

struct Msg {
  int64_t peer, step, nbytes;
};

// One rank's side of one schedule, built once per shape: DDP repeats its buckets.
class RankProgram {
 public:
  static constexpr int64_t kNoWait = int64_t{1} << 30;  // a lag this long: no send waits for a receive

  // `sends` in program order; `recvs` in any order (kept by step); a send at step t
  // waits for the receives at steps up to t - lag.
  RankProgram(std::vector<Msg> sends, std::vector<Msg> recvs, int64_t lag);

  const std::vector<Msg>& sends() const { return sends_; }
  const std::vector<Msg>& recvs() const { return recvs_; }
  const std::vector<int64_t>& peers() const { return peers_; }  // distinct, in first-seen order
  // The peer's index in `peers()`, or -1 when the program has none with it.
  int64_t index_of(int64_t peer) const {
    auto it = index_.find(peer);
    return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  size_t peer_of_send(size_t i) const { return send_peer_[i]; }  // its index in `peers()`
  size_t peer_of_recv(size_t i) const { return recv_peer_[i]; }
  const std::vector<size_t>& sends_to(size_t peer) const { return sends_to_[peer]; }
  const std::vector<size_t>& recvs_from(size_t peer) const { return recvs_from_[peer]; }
  // Whether any send waits for a receive (not a pairwise collective's): only then can
  // data that comes in free a send.
  bool sends_wait() const { return lag_ < kNoWait; }
  // Receives (by step) send `i` waits for: the first k.
  size_t waits_for(size_t send) const { return waits_[send]; }

 private:
  size_t peer_index(int64_t peer);

  std::vector<Msg> sends_, recvs_;
  int64_t lag_;
  std::vector<int64_t> peers_;
  std::vector<size_t> waits_;  // per send
  std::vector<size_t> send_peer_, recv_peer_;  // per message: its peer's index
  std::unordered_map<int64_t, size_t> index_;
  std::vector<std::vector<size_t>> sends_to_, recvs_from_;  // per peer: indices, in order
};

// One instance in flight.
class SimulatedRank {
 public:
  SimulatedRank(std::shared_ptr<const RankProgram> program, double work);

  const RankProgram& program() const { return *program_; }
  void enter(double now) { entry_ = now; }
  double entry() const { return entry_; }

  // The peer posted a receive: one more send to it may go.
  void credit(size_t peer) { ++credit_[peer]; }
  // Data from the peer: its oldest receive not yet served.
  void got(size_t peer, double when);
  // Whether a receive from the peer is still to come (else its data breaks the program).
  bool expects(size_t peer) const { return served_[peer] < program_->recvs_from(peer).size(); }

  enum class Next { kNone, kSend, kLater };
  // The next send to `peer` by `now`: kSend with its index (taken: the caller sends it),
  // kLater with the time it may leave, kNone while it waits for a receive, a credit, or
  // nothing is left.
  Next next_send(size_t peer, double now, size_t* send, double* when);

  bool finished() const { return arrived_count_ == program_->recvs().size() && unsent_ == 0; }
  // The last receive's arrival, or the entry: the instance's end for this rank.
  double done() const { return prefix_.empty() ? entry_ : std::max(entry_, prefix_.back()); }
  bool has_unsent(size_t peer) const { return sent_[peer] < program_->sends_to(peer).size(); }

 private:
  std::shared_ptr<const RankProgram> program_;
  double work_, entry_ = 0.0;
  std::vector<size_t> credit_, sent_, served_;  // per peer
  std::vector<double> arrived_;                 // per receive (by step); NaN: not yet
  std::vector<double> prefix_;                  // latest arrival among the first k receives
  size_t arrived_count_ = 0, unsent_;
};

}  // namespace nbx::sim
