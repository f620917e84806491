#include "ring_timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nbx::timing {

namespace {
constexpr double kNever = -std::numeric_limits<double>::infinity();

int mod(int64_t a, int w) { return static_cast<int>(((a % w) + w) % w); }
}  // namespace

RingTimeline::RingTimeline(RingParams p) : p_(std::move(p)) {}

void RingTimeline::real_sent(int rank, int step, double t) {
  SendLog& log = sent_[rank];
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
    if (1 <= i && i <= j && j - i <= half) t = std::max(t, p_.t0 + delay + (j - i) * edge);
  }
  const int s = step - 2 * j;
  if (s >= 0) t = std::max(t, latest(x, s, emu) + (j - 1) * edge + p_.work);
  return t;
}

}  // namespace nbx::timing
