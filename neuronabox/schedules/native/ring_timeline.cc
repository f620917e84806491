#include "ring_timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nbx::timing {

namespace {
constexpr double kNever = -std::numeric_limits<double>::infinity();

int mod(int64_t a, int w) { return static_cast<int>(((a % w) + w) % w); }
}  // namespace

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double drawn_skew(const std::vector<double>& draws, double shift, uint64_t seed, int rank) {
  if (draws.empty()) return 0;
  const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(rank)));
  return std::max(0.0, draws[h % draws.size()] - shift);
}

RingTimeline::RingTimeline(RingParams p) : p_(std::move(p)) {}

double RingTimeline::drawn_max(int emu, int x, int j, int kmax, double edge) {
  const int down = p_.data_goes_down ? -1 : 1;
  DrawnMax& m = drawn_[emu];
  if (m.k > kmax) m = DrawnMax{};  // asked out of step order: start over (never in the live engine)
  while (m.k < kmax) {
    ++m.k;
    const int q = mod(static_cast<int64_t>(x) + static_cast<int64_t>(j - m.k) * down, p_.world);
    const double term = drawn_skew(p_.skew_draws, p_.skew_shift, p_.skew_seed, q) + m.k * edge;
    m.max = m.k == 0 ? term : std::max(m.max, term);
  }
  return m.max;
}

void RingTimeline::real_sent(int rank, int step, double t) {
  SendLog& log = sent_[rank];
  if (p_.hold_real) t = std::max(t, p_.t0);
  const double arrive = p_.modeled ? t + p_.pace : t;
  log.steps.push_back(step);
  log.times.push_back(log.times.empty() ? arrive : std::max(arrive, log.times.back()));
}

std::pair<int, int> RingTimeline::upstream(int emu) const {
  const auto& r = p_.real;
  const int w = p_.world;
  int x;
  int d;
  if (p_.data_goes_down) {  // nearest real rank strictly above, going up the ring
    auto it = std::upper_bound(r.begin(), r.end(), emu);
    x = it != r.end() ? *it : r.front();
    d = mod(static_cast<int64_t>(x) - emu, w);
  } else {  // nearest real rank strictly below, going down
    auto it = std::lower_bound(r.begin(), r.end(), emu);
    x = it != r.begin() ? *(it - 1) : r.back();
    d = mod(static_cast<int64_t>(emu) - x, w);
  }
  return {x, d == 0 ? w : d};
}

double RingTimeline::latest(int x, int s, int emu) {
  auto found = sent_.find(x);
  if (found == sent_.end()) return kNever;
  const SendLog& log = found->second;
  const int64_t key = static_cast<int64_t>(x) * p_.world + emu;
  std::size_t i = cursor_[key];
  if (i > 0 && log.steps[i - 1] > s) i = 0;  // out of order: start over (never in the live engine)
  while (i < log.steps.size() && log.steps[i] <= s) ++i;
  cursor_[key] = i;
  return i > 0 ? log.times[i - 1] : kNever;
}

double RingTimeline::ready(int emu, int step) {
  const auto [x, j] = upstream(emu);
  const double edge = p_.pace + p_.work;
  const int half = step / 2;
  double t = p_.t0 + std::min(j - 1, half) * edge;
  const int down = p_.data_goes_down ? -1 : 1;
  for (const auto& [q, delay] : p_.stragglers) {
    const int i = mod(static_cast<int64_t>(q - x) * down, p_.world);
    if (1 <= i && i <= j && j - i <= half) {
      const double drawn = drawn_skew(p_.skew_draws, p_.skew_shift, p_.skew_seed, q);  // a straggler varies too
      t = std::max(t, p_.t0 + delay + drawn + (j - i) * edge);
    }
  }
  if (!p_.skew_draws.empty()) t = std::max(t, p_.t0 + drawn_max(emu, x, j, std::min(j - 1, half), edge));
  const int s = step - 2 * j;
  if (s >= 0) t = std::max(t, latest(x, s, emu) + (j - 1) * edge + p_.work);
  return t;
}

}  // namespace nbx::timing
