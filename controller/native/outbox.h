// What one connection has to write, in order: small headers copied in, payloads by
// reference. A flush hands all of it to one sendmsg, so a payload goes from the
// buffer it was received into straight to the kernel.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "bytes.h"

namespace nbx {

enum class FlushResult { kDone, kPartial, kClosed };

class Outbox {
 public:
  // Copy `n` bytes in (frame headers, a dialer's sequence number).
  void append(const uint8_t* p, size_t n);
  // Queue `ref`'s bytes by reference.
  void append(BytesRef ref);

  size_t pending() const { return pending_; }
  bool empty() const { return pending_ == 0; }

  // Gather up to `max` buffers into `iov`; returns how many.
  int gather(struct iovec* iov, int max) const;
  // `n` bytes left: drop what they covered.
  void consume(size_t n);
  // Move everything out as one contiguous copy (tests, the virtual-time driver).
  std::vector<uint8_t> take();
  // The same, into `out` (cleared first; its capacity reused).
  void take_into(std::vector<uint8_t>* out);
  // Hands each queued run of bytes to `fn(data, size)` in order, then empties: what
  // take() does, with no copy (the virtual-time driver's frames to the engine).
  template <class F>
  void drain(F&& fn) {
    for (size_t i = head_; i < pieces_.size(); ++i) {
      const Piece& piece = pieces_[i];
      fn(piece.data() + piece.off, piece.size() - piece.off);
    }
    pieces_.clear();
    head_ = 0;
    pending_ = 0;
  }

  // Write to a non-blocking socket until done or it would block; sets `err` (errno)
  // when the socket is gone.
  FlushResult flush(int fd, int* err);

 private:
  static constexpr size_t kInline = 96;  // two frame headers: a send's notice and its data's

  // A payload by reference, or copied-in bytes: inline while they fit (a frame's headers,
  // the usual case: no allocation per frame), else in `big`.
  struct Piece {
    Piece() {}  // `small` left as it is: it is written before it is read
    BytesRef ref;
    std::vector<uint8_t> big;
    uint8_t small[kInline];
    size_t small_len = 0;
    size_t off = 0;  // bytes of this piece already written
    const uint8_t* data() const { return ref ? ref->data() : (big.empty() ? small : big.data()); }
    size_t size() const { return ref ? ref->size() : (big.empty() ? small_len : big.size()); }
  };
  // Pieces [head_, end) are queued: a vector whose front moves on, and which starts over
  // (keeping its capacity) whenever everything is written.
  std::vector<Piece> pieces_;
  size_t head_ = 0;
  size_t pending_ = 0;
  void drop_front();
};

}  // namespace nbx
