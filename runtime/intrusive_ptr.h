// A minimal intrusive reference-counted pointer: one allocation per object, no control block.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace encore {

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;
  uint32_t use_count() const { return refs_.load(std::memory_order_relaxed); }

 protected:
  virtual ~RefCounted() = default;

 private:
  template <typename T>
  friend class IntrusivePtr;
  void retain() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() const {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  mutable std::atomic<uint32_t> refs_{0};
};

template <typename T>
class IntrusivePtr {
 public:
  IntrusivePtr() = default;
  IntrusivePtr(std::nullptr_t) {}
  explicit IntrusivePtr(T* p) : p_(p) {
    if (p_) p_->retain();
  }
  IntrusivePtr(const IntrusivePtr& o) : p_(o.p_) {
    if (p_) p_->retain();
  }
  IntrusivePtr(IntrusivePtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  template <typename U>
  IntrusivePtr(IntrusivePtr<U>&& o) noexcept : p_(o.detach()) {}
  ~IntrusivePtr() {
    if (p_) p_->release();
  }
  IntrusivePtr& operator=(IntrusivePtr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }

  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const IntrusivePtr& o) const { return p_ == o.p_; }
  T* detach() { return std::exchange(p_, nullptr); }
  void reset() { IntrusivePtr().swap(*this); }
  void swap(IntrusivePtr& o) noexcept { std::swap(p_, o.p_); }

 private:
  T* p_ = nullptr;
};

template <typename T, typename... Args>
IntrusivePtr<T> make_intrusive(Args&&... args) {
  return IntrusivePtr<T>(new T(std::forward<Args>(args)...));
}

}  // namespace encore
