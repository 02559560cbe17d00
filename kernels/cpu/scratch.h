// Per-thread scratch memory of the cpu kernels that need room beside their outputs (conv's padded
// copies and tap offsets, pool's row passes). Each thread keeps one buffer per slot that grows to
// the largest request and is never shrunk, so a kernel allocates only the first time it meets a
// size and a replay at that size allocates nothing.
//
//   enum Slot { kPadded, kWide, kSlots };  // the file's own slots; kSlots counts them
//   T* padded = scratch<T>(kPadded, count);
//
// A slot's contents are undefined on each call. The enum's type keeps files apart (two files
// never share a buffer; one file's slots are shared by its element types), so each file declares
// its Slot enum in an anonymous namespace: two namespace-scope enums of one name would be one
// type, sharing one buffer array of the wrong size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace encore::kernels::cpu {

// 64-byte aligned memory that grows on request and keeps its largest size.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { ::operator delete(data_, kAlign); }

  void* get(size_t bytes) {
    if (bytes > bytes_) {
      ::operator delete(data_, kAlign);
      data_ = nullptr;
      bytes_ = 0;
      data_ = ::operator new(bytes, kAlign);
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// This thread's buffer of `slot`.
template <typename Slot>
ScratchBuffer& thread_scratch_buffer(Slot slot) {
  thread_local ScratchBuffer buffers[Slot::kSlots];
  return buffers[slot];
}

// Room for `count` T's in this thread's buffer of `slot`.
template <typename T, typename Slot>
T* scratch(Slot slot, int64_t count) {
  return static_cast<T*>(thread_scratch_buffer(slot).get(static_cast<size_t>(count) * sizeof(T)));
}

}  // namespace encore::kernels::cpu
