// encore's environment variables are read strictly: a value that is set but not understood gives
// the fallback and says so on stderr.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/env.h"

namespace {

constexpr const char* kName = "ENCORE_ENV_TEST_VARIABLE";

// What `read` returns, with what it wrote to stderr, for the variable set to `value` (unset for
// nullptr).
template <typename Read>
auto with_value(const char* value, Read read, std::string& err) {
  if (value == nullptr)
    unsetenv(kName);
  else
    setenv(kName, value, 1);
  std::fflush(stderr);
  std::FILE* sink = std::tmpfile();
  REQUIRE(sink != nullptr);
  const int saved = dup(2);
  dup2(fileno(sink), 2);
  const auto result = read();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::rewind(sink);
  err.clear();
  for (int c; (c = std::fgetc(sink)) != EOF;) err += static_cast<char>(c);
  std::fclose(sink);
  unsetenv(kName);
  return result;
}

}  // namespace

TEST_CASE("a flag reads on and off words and refuses others aloud", "[env]") {
  using encore::env::flag;
  std::string err;
  for (const char* on : {"1", "on", "true", "yes", "TRUE", "On"}) {
    CHECK(with_value(
        on, [] { return flag(kName, false); }, err));
    CHECK(err.empty());
  }
  for (const char* off : {"0", "off", "false", "no", "OFF"}) {
    CHECK_FALSE(with_value(
        off, [] { return flag(kName, true); }, err));
    CHECK(err.empty());
  }
  CHECK(with_value(
      nullptr, [] { return flag(kName, true); }, err));
  CHECK_FALSE(with_value(
      "", [] { return flag(kName, false); }, err));
  CHECK(err.empty());

  CHECK(with_value(
      "maybe", [] { return flag(kName, true); }, err));
  CHECK(err == std::string("encore: ") + kName +
                   "='maybe' is not one of 1, on, true, yes, 0, off, false, no; using on\n");
  CHECK_FALSE(with_value(
      "2", [] { return flag(kName, false); }, err));
  CHECK(err.find("using off") != std::string::npos);
}

TEST_CASE("an integer reads whole numbers in its range and refuses others aloud", "[env]") {
  using encore::env::integer;
  std::string err;
  auto threads = [] { return integer(kName, 1, 64, 2); };
  CHECK(with_value("8", threads, err) == 8);
  CHECK(err.empty());
  CHECK(with_value("64", threads, err) == 64);
  CHECK(with_value(nullptr, threads, err) == 2);
  CHECK(err.empty());
  for (const char* bad :
       {"0", "65", "-3", "4x", "abc", " ", " 4", "+4", "-", "99999999999999999999999"}) {
    CAPTURE(bad);
    CHECK(with_value(bad, threads, err) == 2);
    CHECK(err == std::string("encore: ") + kName + "='" + bad +
                     "' is not a whole number from 1 to 64; using 2\n");
  }
}

TEST_CASE("a list reads its words in any case and reports the ones it does not know", "[env]") {
  using encore::env::listed;
  std::string err;
  const auto retrace = [] { return listed(kName, "retrace", {"retrace", "plan"}); };
  for (const char* on : {"retrace", "RETRACE", " plan , retrace ", "retrace,", "plan,,retrace"}) {
    INFO(on);
    CHECK(with_value(on, retrace, err));
    CHECK(err.empty());
  }
  CHECK_FALSE(with_value("plan", retrace, err));
  CHECK(err.empty());
  CHECK_FALSE(with_value(nullptr, retrace, err));
  CHECK_FALSE(with_value("", retrace, err));
  CHECK(err.empty());
  // A word it does not know, even one that holds a known word, is reported, and the known ones
  // still count.
  CHECK_FALSE(with_value("retraces", retrace, err));
  CHECK(err.find("ENCORE_ENV_TEST_VARIABLE='retraces' is not a comma-separated list of retrace "
                 "plan") != std::string::npos);
  CHECK(with_value("noretrace,retrace", retrace, err));
  CHECK(err.find("'noretrace,retrace'") != std::string::npos);
}
