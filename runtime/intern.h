// Interned strings: a copy that lives as long as the process, for names that objects with no
// owner of their own refer to (autograd node labels, profiler event names and arguments).
#pragma once

#include <string_view>

namespace encore {

// The process's copy of `s` (equal strings give the same copy). Never freed; thread-safe.
std::string_view intern(std::string_view s);

}  // namespace encore
