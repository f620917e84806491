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

  // Write to a non-blocking socket until done or it would block; sets `err` (errno)
  // when the socket is gone.
  FlushResult flush(int fd, int* err);

 private:
  struct Piece {
    BytesRef ref;               // a payload, or null: the bytes are in `own`
    std::vector<uint8_t> own;   // copied-in headers, appended to while last
    size_t off = 0;             // bytes of this piece already written
    const uint8_t* data() const { return ref ? ref->data() : own.data(); }
    size_t size() const { return ref ? ref->size() : own.size(); }
  };
  std::deque<Piece> pieces_;
  size_t pending_ = 0;
};

}  // namespace nbx
