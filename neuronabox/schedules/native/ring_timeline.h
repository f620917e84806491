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
// step s. Its message arrives one pace c later. Everything the delay model says comes
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
};

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

  RingParams p_;
  std::unordered_map<int, SendLog> sent_;
  std::unordered_map<int64_t, std::size_t> cursor_;  // (x, emu) -> index into x's log
};

}  // namespace nbx::timing
