// Release times of a binomial broadcast's and a dissemination barrier's emulated
// messages: the fast paths of neuronabox/schedules/timing.py (its module docstring
// states the model; `reference_arrivals` there is the oracle the tests hold these to).
//
// Broadcast, over vrank v = (rank - root) mod W: rank r's parent sends to it at bit
// h = bitlen(v) - 1; a rank is ready at max(its entry, its data's arrival + w) and its
// k-th send (k = bit - h, 1-based) arrives latency + k * ser after it was ready.
// Barrier: round k's send of emulated e waits for round k-1's send and receive; the
// closed form takes the longest all-emulated path into e (a table built once per
// world and real set, O(W log W)), the stragglers' and each real rank's sends.
//
// Drawn skew (--skew) adds each emulated rank's draw to its entry (ring_timeline.h's
// `drawn_skew`). A broadcast asks only the ancestors of a boundary rank, O(log W). A
// barrier's round-k send of e waits for every rank at most 2^k - 1 behind it: the
// window is walked once per (e, k) and kept, so an instance costs O(W) whichever real
// ranks it has (the windows of one real rank's senders tile the ring).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nbx::timing {

// What both timelines take of the instance; the delay model's part (latency, the
// serialization of one message, the work per edge) comes in once, here.
struct TreeParams {
  int world = 0;
  int root = 0;
  std::vector<int> real;  // sorted, distinct, non-empty
  double t0 = 0;
  double latency = 0;
  double ser = 0;  // one message's bytes over the hop's bandwidth
  double work = 0;  // an emulated receiver's work before it forwards
  bool hold_real = false;  // no real send counts before t0: a per-collective latency starts it later for all
  bool modeled = true;
  std::vector<std::pair<int, double>> skew;  // rank -> entry delay
  std::vector<double> skew_draws;  // drawn entry delays (seconds); empty: none
  double skew_shift = 0;  // taken off every draw (the real rank's own lateness this time)
  uint64_t skew_seed = 0;  // with the rank, which draw a rank gets
};

class TreeTimeline {
 public:
  explicit TreeTimeline(TreeParams p);
  void real_sent(int rank, int step, double t);
  double arrival(int emu, int step) { return from(emu, step); }
  double boundary_cost() const { return p_.latency + p_.ser; }
  double release(int emu, int step) { return p_.modeled ? arrival(emu, step) : arrival(emu, step) - boundary_cost(); }
  const TreeParams& params() const { return p_; }

 private:
  double from(int parent, int bit);
  double ready(int rank);
  bool is_real(int rank) const;

  TreeParams p_;
  std::unordered_map<int, double> skew_;
  std::unordered_map<int64_t, double> sent_;
  std::unordered_map<int, double> ready_;
};

struct BarrierParams {
  int world = 0;
  std::vector<int> real;  // sorted, distinct, non-empty
  double t0 = 0;
  double latency = 0;
  double work = 0;
  bool hold_real = false;  // no real send counts before t0: a per-collective latency starts it later for all
  bool modeled = true;
  std::vector<std::pair<int, double>> stragglers;  // emulated rank -> entry delay
  std::vector<double> skew_draws;  // drawn entry delays (seconds); empty: none
  double skew_shift = 0;
  uint64_t skew_seed = 0;
};

class BarrierTimeline {
 public:
  explicit BarrierTimeline(BarrierParams p);
  void real_sent(int rank, int step, double t);
  double ready(int emu, int round);
  double arrival(int emu, int step) { return ready(emu, step) + p_.latency; }
  double boundary_cost() const { return p_.latency; }
  double release(int emu, int step) { return p_.modeled ? arrival(emu, step) : arrival(emu, step) - p_.latency; }
  const BarrierParams& params() const { return p_; }

 private:
  // The hops from `src` covering distance m, in rising rounds: (first round, hop
  // count); false when a rank on the way, other than the ends, is real.
  bool path(int src, int64_t m, int* first, int* hops) const;
  bool is_real(int rank) const;
  double drawn(int rank) const;
  // The latest drawn entry, plus its hops, of the ranks whose round-`round` paths into
  // `emu` are all emulated (kept per (emu, round)).
  double drawn_window(int emu, int round);

  BarrierParams p_;
  int rounds_ = 0;
  std::shared_ptr<const std::vector<int64_t>> hops_;  // [round * world + rank], shared by equal worlds
  std::unordered_map<int64_t, double> sent_;
  std::unordered_map<int64_t, double> window_;
};

}  // namespace nbx::timing
