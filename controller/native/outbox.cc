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
  if (pieces_.empty() || pieces_.back().ref || pieces_.back().off != 0) {
    pieces_.emplace_back();
  }
  auto& own = pieces_.back().own;
  own.insert(own.end(), p, p + n);
  pending_ += n;
}

void Outbox::append(BytesRef ref) {
  const size_t n = ref->size();
  if (n == 0) return;
  Piece piece;
  piece.ref = std::move(ref);
  pieces_.push_back(std::move(piece));
  pending_ += n;
}

int Outbox::gather(struct iovec* iov, int max) const {
  int count = 0;
  for (const auto& piece : pieces_) {
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
    Piece& head = pieces_.front();
    const size_t left = head.size() - head.off;
    if (n < left) {
      head.off += n;
      return;
    }
    n -= left;
    pieces_.pop_front();
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
  for (const auto& piece : pieces_) {
    out->insert(out->end(), piece.data() + piece.off, piece.data() + piece.size());
  }
  pieces_.clear();
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
