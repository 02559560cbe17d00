// encore's environment variables, read strictly. A variable that is unset or empty gives the
// fallback; a value that is set but not understood gives the fallback too, and says so once on
// stderr, naming the variable, the value and what is used instead, so that a typo such as
// ENCORE_STATIC_VERIFY=yes or ENCORE_NUM_THREADS=4x does not pass unnoticed.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace encore::env {

// 1, on, true, yes: true; 0, off, false, no: false (any case).
bool flag(const char* name, bool fallback);

// A whole number from lo to hi, written in decimal.
int64_t integer(const char* name, int64_t lo, int64_t hi, int64_t fallback);

// Whether `item` is in the comma-separated list of words the variable holds (any case; spaces
// around a word are ignored). A word that is not one of `known` is reported.
bool listed(const char* name, const char* item, std::initializer_list<const char*> known);

}  // namespace encore::env
