#include "bytes.h"

#include <new>

namespace nbx {

namespace {

int size_class(size_t n) {
  int c = 0;
  size_t cap = BufferPool::kSmallest;
  while (cap < n) {
    cap <<= 1;
    ++c;
  }
  return c;
}

}  // namespace

BufferPool& BufferPool::instance() {
  static BufferPool* pool = new BufferPool();  // never freed: payloads may outlive static destructors
  return *pool;
}

uint8_t* BufferPool::get(size_t n, size_t* capacity) {
  if (n < kSmallest) {
    *capacity = n;
    return static_cast<uint8_t*>(::operator new(n > 0 ? n : 1));
  }
  const int c = size_class(n);
  *capacity = kSmallest << c;
  if (c < kClasses && free_[c] != nullptr) {
    Block* b = free_[c];
    free_[c] = b->next;
    cached_ -= *capacity;
    uint8_t* p = b->p;
    delete b;
    return p;
  }
  return static_cast<uint8_t*>(::operator new(*capacity));
}

void BufferPool::put(uint8_t* p, size_t capacity) {
  if (capacity < kSmallest || cached_ + capacity > kCachedMax) {
    ::operator delete(p);
    return;
  }
  const int c = size_class(capacity);
  if (c >= kClasses) {
    ::operator delete(p);
    return;
  }
  free_[c] = new Block{p, free_[c]};
  cached_ += capacity;
}

}  // namespace nbx
