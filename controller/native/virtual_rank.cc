#include "virtual_rank.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace nbx::sim {

RankProgram::RankProgram(std::vector<Msg> sends, std::vector<Msg> recvs, int64_t lag)
    : sends_(std::move(sends)), recvs_(std::move(recvs)), lag_(lag) {
  std::stable_sort(recvs_.begin(), recvs_.end(), [](const Msg& a, const Msg& b) { return a.step < b.step; });
  std::vector<int64_t> steps;
  steps.reserve(recvs_.size());
  for (const Msg& m : recvs_) steps.push_back(m.step);
  waits_.reserve(sends_.size());
  for (const Msg& m : sends_) {
    waits_.push_back(static_cast<size_t>(std::upper_bound(steps.begin(), steps.end(), m.step - lag_) - steps.begin()));
  }
  for (size_t i = 0; i < recvs_.size(); ++i) {
    recv_peer_.push_back(peer_index(recvs_[i].peer));
    recvs_from_[recv_peer_.back()].push_back(i);
  }
  for (size_t i = 0; i < sends_.size(); ++i) {
    send_peer_.push_back(peer_index(sends_[i].peer));
    sends_to_[send_peer_.back()].push_back(i);
  }
}

size_t RankProgram::peer_index(int64_t peer) {
  if (auto it = index_.find(peer); it != index_.end()) return it->second;  // (emplace would allocate first)
  index_.emplace(peer, peers_.size());
  peers_.push_back(peer);
  sends_to_.emplace_back();
  recvs_from_.emplace_back();
  return peers_.size() - 1;
}

SimulatedRank::SimulatedRank(std::shared_ptr<const RankProgram> program, double work)
    : program_(std::move(program)), work_(work) {
  const size_t peers = program_->peers().size();
  credit_.assign(peers, 0);
  sent_.assign(peers, 0);
  served_.assign(peers, 0);
  arrived_.assign(program_->recvs().size(), std::nan(""));
  prefix_.reserve(program_->recvs().size());
  unsent_ = program_->sends().size();
}

void SimulatedRank::got(size_t peer, double when) {
  const auto& mine = program_->recvs_from(peer);
  const size_t i = mine[served_[peer]++];  // the caller checks a receive is left (the wire does)
  arrived_[i] = when;
  ++arrived_count_;
  while (prefix_.size() < arrived_.size() && !std::isnan(arrived_[prefix_.size()])) {
    const double a = arrived_[prefix_.size()];
    prefix_.push_back(prefix_.empty() ? a : std::max(prefix_.back(), a));
  }
}

SimulatedRank::Next SimulatedRank::next_send(size_t peer, double now, size_t* send, double* when) {
  const auto& mine = program_->sends_to(peer);
  if (sent_[peer] >= mine.size() || credit_[peer] == 0) return Next::kNone;
  const size_t i = mine[sent_[peer]];
  const size_t k = program_->waits_for(i);
  if (k > prefix_.size()) return Next::kNone;
  const double t = k != 0 ? std::max(entry_, prefix_[k - 1] + work_) : entry_;
  if (t > now) {
    *when = t;
    return Next::kLater;
  }
  ++sent_[peer];
  --credit_[peer];
  --unsent_;
  *send = i;
  return Next::kSend;
}

}  // namespace nbx::sim
