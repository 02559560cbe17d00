// runtime/env.h
#include "runtime/env.h"

#include <strings.h>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace encore::env {
namespace {

// Called from static initializers too, so it writes with stdio rather than a stream.
void ignored(const char* name, const char* value, const char* expected, const char* used) {
  std::fprintf(stderr, "encore: %s='%s' is not %s; using %s\n", name, value, expected, used);
}

}  // namespace

bool flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  for (const char* on : {"1", "on", "true", "yes"})
    if (strcasecmp(v, on) == 0) return true;
  for (const char* off : {"0", "off", "false", "no"})
    if (strcasecmp(v, off) == 0) return false;
  ignored(name, v, "one of 1, on, true, yes, 0, off, false, no", fallback ? "on" : "off");
  return fallback;
}

int64_t integer(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  // Digits, with a minus sign at most (strtoll would skip spaces and take a plus).
  const bool digits = std::isdigit(static_cast<unsigned char>(v[v[0] == '-' ? 1 : 0])) != 0;
  const long long n = std::strtoll(v, &end, 10);
  if (digits && *end == '\0' && errno == 0 && n >= lo && n <= hi) return n;
  char expected[96];
  char used[32];
  std::snprintf(expected, sizeof expected, "a whole number from %lld to %lld",
                static_cast<long long>(lo), static_cast<long long>(hi));
  std::snprintf(used, sizeof used, "%lld", static_cast<long long>(fallback));
  ignored(name, v, expected, used);
  return fallback;
}

bool listed(const char* name, const char* item, std::initializer_list<const char*> known) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  bool found = false, unknown = false;
  for (const char* p = v; *p != '\0';) {
    const char* end = std::strchr(p, ',');
    if (end == nullptr) end = p + std::strlen(p);
    const char* b = p;
    const char* e = end;
    while (b < e && std::isspace(static_cast<unsigned char>(*b))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(e[-1]))) --e;
    const size_t n = static_cast<size_t>(e - b);
    bool is_known = n == 0;  // (an empty word, as in "a,,b", is skipped)
    for (const char* k : known)
      if (std::strlen(k) == n && strncasecmp(b, k, n) == 0) {
        is_known = true;
        found = found || strcasecmp(k, item) == 0;
      }
    unknown = unknown || !is_known;
    p = *end == ',' ? end + 1 : end;
  }
  if (unknown) {
    char expected[160] = "a comma-separated list of";
    for (const char* k : known) {
      std::strncat(expected, " ", sizeof expected - std::strlen(expected) - 1);
      std::strncat(expected, k, sizeof expected - std::strlen(expected) - 1);
    }
    ignored(name, v, expected, "the words it knows");
  }
  return found;
}

}  // namespace encore::env
