// Release times of a ring's emulated messages (allreduce, allgather): the closed
// form of neuronabox/schedules/timing.py, in the per-message path.
//
// Rank e at distance j downstream of its nearest real rank x (the chain x -> ... -> e
// is all emulated) is ready for step t at
//
//   max( T + min(j-1, t/2) (c+w),                      entries of the chain
//        T + skew(q) + (j-i) (c+w),   if j-i <= t/2,   a straggler q at distance i <= j
//        A_x(t - 2j) + (j-1) (c+w) + w )                the wave from x
//
// where A_x(s) is the latest arrival at x's emulated neighbour of x's sends up to
// step s. Its message arrives one pace c later.
//
// Drawn skew (--skew) makes every emulated rank a straggler, its delay a draw from an
// empirical distribution (`skew_draws`, shifted down by `skew_shift`, never below 0),
// picked by a hash of the seed and the rank. The straggler term then is a maximum
// over the chain's last min(j-1, t/2)+1 ranks, kept per rank as t grows: O(1) amortized
// per message in step order, as the live engine asks, at any world size. Everything the delay model says comes
// in once, in the constructor; per message there is no allocation but the real
// rank's send log.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nbx::timing {

struct RingParams {
  int world = 0;
  std::vector<int> real;  // sorted, distinct, non-empty
  bool data_goes_down = true;  // allreduce: rank e sends to e-1 (its upstream is above it)
  double t0 = 0;  // the emulated ranks' entry
  double pace = 0;  // c: seconds per two steps
  double work = 0;  // w: an emulated receiver's work before it sends on
  bool modeled = true;  // the boundary hop is priced by the model
  std::vector<std::pair<int, double>> stragglers;  // emulated rank -> entry delay
  std::vector<double> skew_draws;  // drawn entry delays (seconds); empty: none
  double skew_shift = 0;  // taken off every draw (the real rank's own lateness this time)
  uint64_t skew_seed = 0;  // with the rank, which draw a rank gets
  bool hold_real = false;  // no real send counts before t0: a per-collective latency starts it later for all
};

// The entry delay rank `rank` draws: the same function as neuronabox/schedules/timing.py's.
double drawn_skew(const std::vector<double>& draws, double shift, uint64_t seed, int rank);

class RingTimeline {
 public:
  explicit RingTimeline(RingParams p);

  // Real `rank`'s boundary send of `step` reached the controller at `t`.
  void real_sent(int rank, int step, double t);
  double ready(int emu, int step);
  double arrival(int emu, int step) { return ready(emu, step) + p_.pace; }
  double boundary_cost() const { return p_.pace; }
  double release(int emu, int step) { return p_.modeled ? arrival(emu, step) : arrival(emu, step) - p_.pace; }
  const RingParams& params() const { return p_; }

 private:
  struct SendLog {
    std::vector<int> steps;
    std::vector<double> times;  // prefix maximum of arrivals
  };
  // (x, j): the nearest real rank upstream of `emu` and its distance.
  std::pair<int, int> upstream(int emu) const;
  double latest(int x, int s, int emu);
  // max over k in [0, kmax] of skew(rank at distance j-k from x) + k * edge
  double drawn_max(int emu, int x, int j, int kmax, double edge);

  RingParams p_;
  std::unordered_map<int, SendLog> sent_;
  std::unordered_map<int64_t, std::size_t> cursor_;  // (x, emu) -> index into x's log
  struct DrawnMax {
    int k = -1;  // the window covers k = 0..k
    double max = 0;
  };
  std::unordered_map<int, DrawnMax> drawn_;  // emu -> its straggler window so far
};

}  // namespace nbx::timing
