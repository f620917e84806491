// The commands a collective's bookkeeping gives one pair, in any library's dialect.
//
// The book (book.h) knows schedules and dependencies, never frames: it posts a
// receive and sends a payload through this interface, and the dialect's pair machine
// (gloo_pair.h for Gloo) turns each command into that library's frames.
#pragma once

#include <cstdint>

#include "bytes.h"

namespace nbx {

class Port {
 public:
  virtual ~Port() = default;
  // The emulated side posts a receive of `length` bytes on `slot`.
  virtual void recv_ready(uint64_t slot, uint64_t length) = 0;
  // The emulated side sends `payload` on `slot` (announcement and data, as the library does).
  virtual void send(uint64_t slot, BytesRef payload) = 0;
};

}  // namespace nbx
