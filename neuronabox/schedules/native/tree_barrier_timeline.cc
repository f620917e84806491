#include "tree_barrier_timeline.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "ring_timeline.h"  // drawn_skew: one function for every timeline

namespace nbx::timing {

namespace {

constexpr double kNever = -std::numeric_limits<double>::infinity();

int bit_length(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

int64_t key(int rank, int step) { return (static_cast<int64_t>(rank) << 32) | static_cast<uint32_t>(step); }

int mod(int64_t a, int w) { return static_cast<int>(((a % w) + w) % w); }

// h[k][e]: the most hops on a path of emulated ranks into e by round k (entries of
// emulated ranks are its sources; real ranks cut paths). One table per (world, real
// set), kept for the next instance of the same group: a barrier's is O(W log W).
std::shared_ptr<const std::vector<int64_t>> emulated_hops(int world, const std::vector<int>& real, int rounds) {
  static std::mutex mu;
  static std::pair<int, std::vector<int>> last_key;
  static std::shared_ptr<const std::vector<int64_t>> last;
  std::lock_guard<std::mutex> lock(mu);
  if (last && last_key.first == world && last_key.second == real) return last;
  std::vector<char> emulated(world, 1);
  for (int r : real) emulated[r] = 0;
  auto h = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(rounds + 1) * world, 0);
  for (int r : real) (*h)[r] = -(int64_t{1} << 40);
  for (int k = 0; k < rounds; ++k) {
    const int64_t* cur = h->data() + static_cast<size_t>(k) * world;
    int64_t* next = h->data() + static_cast<size_t>(k + 1) * world;
    for (int e = 0; e < world; ++e) {
      const int64_t shifted = cur[mod(int64_t{e} - (int64_t{1} << k), world)] + 1;
      next[e] = emulated[e] ? std::max(cur[e], shifted) : cur[e];
    }
  }
  last_key = {world, real};
  last = h;
  return last;
}

}  // namespace

// -- binomial broadcast ---------------------------------------------------------------
TreeTimeline::TreeTimeline(TreeParams p) : p_(std::move(p)) {
  for (const auto& [rank, delay] : p_.skew) skew_[rank] = delay;
}

bool TreeTimeline::is_real(int rank) const { return std::binary_search(p_.real.begin(), p_.real.end(), rank); }

void TreeTimeline::real_sent(int rank, int step, double t) {
  if (p_.hold_real) t = std::max(t, p_.t0);
  sent_[key(rank, step)] = p_.modeled ? t + p_.latency + p_.ser : t;
}

double TreeTimeline::from(int parent, int bit) {
  if (is_real(parent)) {
    auto it = sent_.find(key(parent, bit));
    return it == sent_.end() ? kNever : it->second;
  }
  const int v = mod(int64_t{parent} - p_.root, p_.world);
  const int k = bit - (bit_length(v) - 1);  // its k-th send on its link
  return ready(parent) + p_.latency + k * p_.ser;
}

double TreeTimeline::ready(int rank) {
  auto memo = ready_.find(rank);
  if (memo != ready_.end()) return memo->second;
  auto s = skew_.find(rank);
  double t = p_.t0 + (s == skew_.end() ? 0.0 : s->second) + drawn_skew(p_.skew_draws, p_.skew_shift, p_.skew_seed, rank);
  const int v = mod(int64_t{rank} - p_.root, p_.world);
  double got = t;
  if (v != 0) {
    const int h = bit_length(v) - 1;
    got = from(mod(int64_t{v} - (1 << h) + p_.root, p_.world), h) + p_.work;  // a receiver works, then forwards
  }
  if (got != kNever) {  // a real parent's send not seen yet: ask again later
    t = std::max(t, got);
    ready_[rank] = t;
  }
  return t;
}

// -- dissemination barrier --------------------------------------------------------------
BarrierTimeline::BarrierTimeline(BarrierParams p) : p_(std::move(p)) {
  rounds_ = p_.world > 1 ? bit_length(static_cast<uint64_t>(p_.world - 1)) : 0;
  hops_ = emulated_hops(p_.world, p_.real, rounds_);
}

bool BarrierTimeline::is_real(int rank) const { return std::binary_search(p_.real.begin(), p_.real.end(), rank); }

void BarrierTimeline::real_sent(int rank, int step, double t) {
  if (p_.hold_real) t = std::max(t, p_.t0);
  sent_[key(rank, step)] = p_.modeled ? t + p_.latency : t;
}

double BarrierTimeline::drawn(int rank) const {
  return drawn_skew(p_.skew_draws, p_.skew_shift, p_.skew_seed, rank);
}

double BarrierTimeline::drawn_window(int emu, int round) {
  const int64_t k = key(emu, round);
  auto memo = window_.find(k);
  if (memo != window_.end()) return memo->second;
  const int w = p_.world;
  const int64_t span = std::min<int64_t>((int64_t{1} << round) - 1, w - 1);
  const double edge = p_.latency + p_.work;
  bool cut = false;  // a real rank inside the window: some paths through it are not all emulated
  for (int x : p_.real) cut = cut || (x != emu && mod(int64_t{emu} - x, w) <= span);
  double best = kNever;
  int first, hops;
  for (int64_t m = 0; m <= span; ++m) {
    const int q = mod(int64_t{emu} - m, w);
    if (is_real(q) || (cut && m > 0 && !path(q, m, &first, &hops))) continue;
    best = std::max(best, drawn(q) + __builtin_popcountll(static_cast<uint64_t>(m)) * edge);
  }
  window_[k] = best;
  return best;
}

bool BarrierTimeline::path(int src, int64_t m, int* first, int* hops) const {
  int node = src;
  *first = -1;
  for (int k = 0; k < bit_length(static_cast<uint64_t>(m)); ++k) {
    if (!((m >> k) & 1)) continue;
    if (*first < 0) *first = k;
    node = mod(int64_t{node} + (int64_t{1} << k), p_.world);
    if (is_real(node) && (m >> (k + 1)) != 0) return false;
  }
  *hops = __builtin_popcountll(static_cast<uint64_t>(m));
  return true;
}

double BarrierTimeline::ready(int emu, int round) {
  const int w = p_.world;
  const int64_t span = (int64_t{1} << round) - 1;
  const double edge = p_.latency + p_.work;
  double t = p_.t0 + static_cast<double>((*hops_)[static_cast<size_t>(round) * w + emu]) * edge;
  int first, hops;
  if (!p_.skew_draws.empty()) t = std::max(t, p_.t0 + drawn_window(emu, round));
  for (const auto& [q, delay] : p_.stragglers) {
    for (int64_t m = mod(int64_t{emu} - q, w); m <= span; m += w) {
      if (m == 0 || path(q, m, &first, &hops)) {  // a straggler varies too
        t = std::max(t, p_.t0 + delay + drawn(q) + __builtin_popcountll(static_cast<uint64_t>(m)) * edge);
      }
    }
  }
  for (int x : p_.real) {
    for (int64_t m = mod(int64_t{emu} - x, w); m > 0 && m <= span; m += w) {
      if (!path(x, m, &first, &hops)) continue;
      auto it = sent_.find(key(x, first));
      const double sent = it == sent_.end() ? kNever : it->second;
      t = std::max(t, sent + p_.work + (hops - 1) * edge);  // x's first receiver works too
    }
  }
  return t;
}

}  // namespace nbx::timing
