#include "outbox.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace nbx {

namespace {
constexpr int kMaxIov = 1024;  // IOV_MAX on Linux
}

void Outbox::append(const uint8_t* p, size_t n) {
  if (n == 0) return;
  if (head_ == pieces_.size() || pieces_.back().ref || pieces_.back().off != 0) {
    pieces_.emplace_back();
  }
  Piece& last = pieces_.back();
  if (last.big.empty() && last.small_len + n <= kInline) {
    std::memcpy(last.small + last.small_len, p, n);
    last.small_len += n;
  } else {
    if (last.big.empty()) last.big.assign(last.small, last.small + last.small_len);
    last.big.insert(last.big.end(), p, p + n);
  }
  pending_ += n;
}

void Outbox::append(BytesRef ref) {
  const size_t n = ref->size();
  if (n == 0) return;
  pieces_.emplace_back();
  pieces_.back().ref = std::move(ref);
  pending_ += n;
}

void Outbox::drop_front() {
  pieces_[head_].ref.reset();  // let go of its payload now
  pieces_[head_].big = {};
  if (++head_ == pieces_.size()) {
    pieces_.clear();
    head_ = 0;
  } else if (head_ >= 64 && head_ * 2 >= pieces_.size()) {  // a socket that never drains: no unbounded front
    pieces_.erase(pieces_.begin(), pieces_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
}

int Outbox::gather(struct iovec* iov, int max) const {
  int count = 0;
  for (size_t i = head_; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    if (count == max) break;
    iov[count].iov_base = const_cast<uint8_t*>(piece.data() + piece.off);
    iov[count].iov_len = piece.size() - piece.off;
    ++count;
  }
  return count;
}

void Outbox::consume(size_t n) {
  pending_ -= n;
  while (n > 0) {
    Piece& head = pieces_[head_];
    const size_t left = head.size() - head.off;
    if (n < left) {
      head.off += n;
      return;
    }
    n -= left;
    drop_front();
  }
}

std::vector<uint8_t> Outbox::take() {
  std::vector<uint8_t> out;
  take_into(&out);
  return out;
}

void Outbox::take_into(std::vector<uint8_t>* out) {
  out->clear();
  out->reserve(pending_);
  for (size_t i = head_; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    out->insert(out->end(), piece.data() + piece.off, piece.data() + piece.size());
  }
  pieces_.clear();
  head_ = 0;
  pending_ = 0;
}

FlushResult Outbox::flush(int fd, int* err) {
  struct iovec iov[kMaxIov];
  while (pending_ > 0) {
    struct msghdr msg;
    std::memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = gather(iov, kMaxIov);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return FlushResult::kPartial;
      *err = errno;
      return FlushResult::kClosed;
    }
    consume(static_cast<size_t>(n));
  }
  return FlushResult::kDone;
}

}  // namespace nbx
