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

// Memory for payloads, reused: a fresh buffer costs a page fault per 4 KiB when the
// socket first writes it, more than the copy itself. Large blocks come back to a free
// list per power-of-two size, up to a fixed total; beyond it they go back to the system.
// Single-threaded, as the data plane is.
class BufferPool {
 public:
  static constexpr size_t kSmallest = 64 * 1024;    // below this, malloc's own bins serve well
  static constexpr size_t kCachedMax = 256u << 20;  // bytes kept for reuse at most

  static BufferPool& instance();
  uint8_t* get(size_t n, size_t* capacity);
  void put(uint8_t* p, size_t capacity);
  size_t cached() const { return cached_; }

 private:
  static constexpr int kClasses = 48;
  struct Block {
    uint8_t* p;
    Block* next;
  };
  Block* free_[kClasses] = {};
  size_t cached_ = 0;
};

// Bytes allocated here, uninitialized: the socket writes them before anyone reads. A
// small payload (a large ring's segment is tens of bytes) lives in the object itself.
class OwnedBytes final : public Bytes {
 public:
  static constexpr size_t kInline = 128;

  explicit OwnedBytes(size_t n) : size_(n) {
    buf_ = n <= kInline ? inline_ : BufferPool::instance().get(n, &capacity_);
  }
  ~OwnedBytes() override {
    if (buf_ != inline_) BufferPool::instance().put(buf_, capacity_);
  }
  OwnedBytes(const OwnedBytes&) = delete;
  OwnedBytes& operator=(const OwnedBytes&) = delete;
  const uint8_t* data() const override { return buf_; }
  size_t size() const override { return size_; }
  uint8_t* mutable_data() { return buf_; }

 private:
  uint8_t* buf_;
  size_t size_;
  size_t capacity_ = 0;
  uint8_t inline_[kInline];
};

}  // namespace nbx
