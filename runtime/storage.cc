#include "runtime/storage.h"

namespace encore {

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() {
  allocator_for(device_).deallocate(data_, nbytes_);
}

}  // namespace encore
