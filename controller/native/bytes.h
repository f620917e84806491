// Byte ranges that outlive the call that made them: a payload is received once into
// an OwnedBytes and sent on from the same memory, however many frames carry it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace nbx {

// An immutable run of bytes whose owner keeps it alive (a received payload, or a
// buffer the control plane handed in).
class Bytes {
 public:
  virtual ~Bytes() = default;
  virtual const uint8_t* data() const = 0;
  virtual size_t size() const = 0;
};

using BytesRef = std::shared_ptr<const Bytes>;

// Bytes allocated here, uninitialized: the socket writes them before anyone reads.
class OwnedBytes final : public Bytes {
 public:
  explicit OwnedBytes(size_t n) : buf_(new uint8_t[n > 0 ? n : 1]), size_(n) {}
  const uint8_t* data() const override { return buf_.get(); }
  size_t size() const override { return size_; }
  uint8_t* mutable_data() { return buf_.get(); }

 private:
  std::unique_ptr<uint8_t[]> buf_;
  size_t size_;
};

}  // namespace nbx
