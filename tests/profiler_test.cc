// The profiler: exact per-op counts for eager ops and replayed static steps, consistent totals,
// the table, the Chrome trace (parsed back: well-formed JSON, every replayed step inside its
// schedule's span), nothing recorded while off, the event cap, and ENCORE_PROFILE (through
// start_from_env and through a child process that exits).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "encore/encore.h"
#include "encore/profiler.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
namespace prof = encore::profiler;

namespace {

// ---- A small JSON reader: enough to check the trace is well formed and to read it back ----

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  std::string text;  // a number's digits as written, or a string's value
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json* get(const std::string& key) const {
    for (const auto& [k, v] : fields)
      if (k == key) return &v;
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}

  Json document() {
    Json v = value();
    space();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("JSON: " + why + " at offset " + std::to_string(pos_));
  }
  void space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  char peek() {
    space();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_value() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
        case 'f':
          break;
        case 'u':
          if (pos_ + 4 > s_.size()) fail("short \\u escape");
          pos_ += 4;
          out += '?';
          break;
        default:
          fail("bad escape");
      }
    }
  }
  Json value() {
    Json v;
    const char c = peek();
    if (c == '{') {
      v.kind = Json::Object;
      ++pos_;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      while (true) {
        std::string key = string_value();
        expect(':');
        v.fields.emplace_back(std::move(key), value());
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      while (true) {
        v.items.push_back(value());
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      v.text = string_value();
      return v;
    }
    for (const char* word : {"true", "false", "null"}) {
      const std::string w = word;
      if (s_.compare(pos_, w.size(), w) == 0) {
        pos_ += w.size();
        v.kind = w == "null" ? Json::Null : Json::Bool;
        v.text = w;
        return v;
      }
    }
    const size_t begin = pos_;
    if (s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' ||
            s_[pos_] == 'e' || s_[pos_] == 'E' || s_[pos_] == '+' || s_[pos_] == '-'))
      ++pos_;
    if (pos_ == begin) fail("unexpected character");
    v.kind = Json::Number;
    v.text = s_.substr(begin, pos_ - begin);
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

// A trace time ("12.345" microseconds) in nanoseconds, exactly.
int64_t ns_of(const Json& v) {
  REQUIRE(v.kind == Json::Number);
  const size_t dot = v.text.find('.');
  if (dot == std::string::npos) return std::stoll(v.text) * 1000;
  std::string frac = v.text.substr(dot + 1);
  REQUIRE(frac.size() <= 3);
  while (frac.size() < 3) frac += '0';
  return std::stoll(v.text.substr(0, dot)) * 1000 + std::stoll(frac);
}

struct TraceEvent {
  std::string name, cat;
  int64_t ts = 0, dur = 0, tid = 0;
  int step = -1;
  std::string schedule;
};

// Reads a Chrome trace back; REQUIREs the shape every "X" event must have.
std::vector<TraceEvent> read_trace(const std::string& text) {
  const Json doc = JsonReader(text).document();
  REQUIRE(doc.kind == Json::Object);
  const Json* events = doc.get("traceEvents");
  REQUIRE(events != nullptr);
  REQUIRE(events->kind == Json::Array);
  std::vector<TraceEvent> out;
  for (const Json& e : events->items) {
    REQUIRE(e.kind == Json::Object);
    const Json* ph = e.get("ph");
    REQUIRE(ph != nullptr);
    if (ph->text != "X") {
      CHECK(ph->text == "M");
      continue;
    }
    for (const char* key : {"name", "cat", "ts", "dur", "pid", "tid", "args"})
      REQUIRE(e.get(key) != nullptr);
    TraceEvent t;
    t.name = e.get("name")->text;
    t.cat = e.get("cat")->text;
    t.ts = ns_of(*e.get("ts"));
    t.dur = ns_of(*e.get("dur"));
    t.tid = std::stoll(e.get("tid")->text);
    if (const Json* step = e.get("args")->get("step")) {
      t.step = std::stoi(step->text);
      REQUIRE(e.get("args")->get("schedule") != nullptr);
      t.schedule = e.get("args")->get("schedule")->text;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string temp_path(const std::string& name) {
  return cat("/tmp/encore_profiler_test_", ::getpid(), "_", name);
}

// Sum of totals over the rows, and shares.
void check_totals(const prof::Profile& p) {
  int64_t sum = 0;
  double share = 0;
  for (const prof::OpRow& r : p.ops()) {
    sum += r.total_ns;
    share += r.share;
    CHECK(r.calls > 0);
    CHECK(r.total_ns >= 0);
  }
  CHECK(sum == p.total_ns());
  CHECK(p.total_ns(prof::Mode::Eager) + p.total_ns(prof::Mode::Trace) +
            p.total_ns(prof::Mode::Replay) ==
        p.total_ns());
  if (!p.ops().empty() && p.total_ns() > 0) CHECK(share == Approx(1.0));
  for (size_t i = 1; i < p.ops().size(); ++i) CHECK(p.ops()[i - 1].total_ns >= p.ops()[i].total_ns);
}

// Runs the eager sequence the counting tests know: per round one add, one relu, one mul_scalar.
void eager_rounds(const Tensor& x, const Tensor& w, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    Tensor y = F::relu(F::add(x, w));
    Tensor z = F::mul(y, 2.0);
    REQUIRE(z.defined());
  }
}

}  // namespace

TEST_CASE("the profiler counts a known eager sequence exactly", "[profiler]") {
  const Tensor x = rand({4, 3});
  const Tensor w = rand({4, 3});
  prof::start();
  CHECK(prof::enabled());
  eager_rounds(x, w, 3);
  const prof::Profile p = prof::stop();
  CHECK_FALSE(prof::enabled());

  CHECK(p.calls("add", prof::Mode::Eager) == 3);
  CHECK(p.calls("relu", prof::Mode::Eager) == 3);
  CHECK(p.calls("mul_scalar", prof::Mode::Eager) == 3);
  CHECK(p.calls("relu", prof::Mode::Replay) == 0);
  CHECK(p.total_calls() == 9);
  CHECK(p.ops().size() == 3);
  CHECK(p.events().size() == 9);
  CHECK(p.dropped_events() == 0);
  CHECK(p.spans().empty());
  CHECK(p.total_ns() > 0);
  CHECK(p.wall_ns() >= p.total_ns());
  check_totals(p);
  for (const prof::Event& e : p.events()) {
    CHECK_FALSE(e.is_span);
    CHECK(e.mode == prof::Mode::Eager);
    CHECK(e.start_ns >= 0);
  }
  // Shapes ride along as event arguments.
  bool saw_add = false;
  for (const prof::Event& e : p.events())
    if (e.name == "add") {
      saw_add = true;
      CHECK(e.args == "float32[4,3], float32[4,3] -> float32[4,3]");
    }
  CHECK(saw_add);

  const std::string table = p.table();
  CHECK_THAT(table, Contains("calls") && Contains("total ms") && Contains("per call us") &&
                        Contains("share") && Contains("mode") && Contains("op"));
  CHECK_THAT(table,
             Contains("eager   relu") && Contains("eager   add") && Contains("eager   mul_scalar"));
  CHECK_THAT(table, Contains("9 op calls"));
}

TEST_CASE("nothing is recorded while the profiler is off", "[profiler]") {
  const Tensor x = rand({2, 2});
  const Tensor w = rand({2, 2});
  CHECK_FALSE(prof::enabled());
  eager_rounds(x, w, 2);  // before any session
  prof::start();
  const prof::Profile empty = prof::stop();
  CHECK(empty.total_calls() == 0);
  CHECK(empty.events().empty());
  CHECK(empty.ops().empty());

  prof::start();
  eager_rounds(x, w, 1);
  const prof::Profile one = prof::stop();
  eager_rounds(x, w, 4);  // between sessions
  prof::start();
  eager_rounds(x, w, 2);
  const prof::Profile two = prof::stop();
  CHECK(one.total_calls() == 3);
  CHECK(two.total_calls() == 6);
  CHECK(two.calls("relu", prof::Mode::Eager) == 2);
  CHECK(prof::stop().total_calls() == 0);  // stopping twice hands over nothing
}

TEST_CASE("a second start while recording throws", "[profiler]") {
  prof::start();
  CHECK_THROWS_WITH(prof::start(), Contains("already running"));
  prof::stop();
  CHECK_THROWS_WITH(prof::start(prof::Options{.max_events = -1}), Contains("max_events"));
  CHECK_FALSE(prof::enabled());
}

TEST_CASE("replays of a static function are counted under replay, step by step", "[profiler]") {
  const testing::StaticFusion unfused(false);  // every op its own step
  const Tensor w = rand({8}, DType::Float32, Device::cpu(), -1, 1);
  auto f = static_graph(
      [&w](const Tensor& x) { return F::sum(F::tanh(F::mul(F::relu(F::mul(x, w)), 0.5))); },
      {.name = "prof_chain", .arg_names = {"x"}});
  Tensor x = rand({8}, DType::Float32, Device::cpu(), -1, 1).set_requires_grad();
  constexpr int kCalls = 5;

  prof::start();
  for (int i = 0; i < kCalls; ++i) {
    f(x).backward();
    x.set_grad(Tensor());
  }
  const prof::Profile p = prof::stop();

  const StaticStats st = f.stats();
  REQUIRE(st.traces == 1);
  REQUIRE(st.hits == kCalls - 1);
  REQUIRE(st.cache.size() == 1);
  const int fwd = st.cache[0].forward_steps, bwd = st.cache[0].backward_steps;
  REQUIRE(fwd > 0);
  REQUIRE(bwd > 0);

  // The first call's ops ran under the tracer; every later call replayed each step once.
  CHECK(p.calls("relu", prof::Mode::Trace) == 1);
  CHECK(p.calls("relu", prof::Mode::Replay) == kCalls - 1);
  CHECK(p.calls("tanh", prof::Mode::Replay) == kCalls - 1);
  CHECK(p.calls("relu_grad", prof::Mode::Trace) == 1);
  CHECK(p.calls("relu_grad", prof::Mode::Replay) == kCalls - 1);
  CHECK(p.calls("relu", prof::Mode::Eager) == 0);
  int64_t replayed = 0;
  for (const prof::OpRow& r : p.ops())
    if (r.mode == prof::Mode::Replay) replayed += r.calls;
  CHECK(replayed == (kCalls - 1) * (fwd + bwd));
  check_totals(p);

  std::map<std::string, int64_t> span_calls;
  for (const prof::SpanRow& s : p.spans()) span_calls[s.name] = s.calls;
  CHECK(span_calls["prof_chain [entry 1] trace"] == 1);
  CHECK(span_calls["prof_chain [entry 1] trace backward"] == 1);
  CHECK(span_calls["prof_chain [entry 1] forward replay"] == kCalls - 1);
  CHECK(span_calls["prof_chain [entry 1] backward replay"] == kCalls - 1);
  CHECK(span_calls["autograd backward"] >= kCalls);

  const std::string table = p.table();
  CHECK_THAT(table, Contains("replay  relu") && Contains("trace   relu") &&
                        Contains("forward_replay") && Contains("prof_chain [entry 1]"));

  // The Chrome trace, written and read back.
  const std::string path = temp_path("static.json");
  p.write_chrome_trace(path);
  const std::vector<TraceEvent> events = read_trace(read_file(path));
  std::remove(path.c_str());
  REQUIRE(events.size() == p.events().size());
  std::vector<const TraceEvent*> fwd_spans, bwd_spans;
  int64_t steps = 0;
  for (const TraceEvent& e : events) {
    if (e.cat == "forward_replay") fwd_spans.push_back(&e);
    if (e.cat == "backward_replay") bwd_spans.push_back(&e);
  }
  CHECK(fwd_spans.size() == kCalls - 1);
  CHECK(bwd_spans.size() == kCalls - 1);
  std::map<std::pair<std::string, int>, int> step_counts;
  for (const TraceEvent& e : events) {
    if (e.cat != "replay") continue;
    ++steps;
    REQUIRE(e.step >= 0);
    ++step_counts[{e.schedule, e.step}];
    CHECK(e.step < (e.schedule == "forward" ? fwd : bwd));
    // Each step lies within a span of its own schedule on its own thread.
    const auto& spans = e.schedule == "forward" ? fwd_spans : bwd_spans;
    int parents = 0;
    for (const TraceEvent* s : spans)
      parents += s->tid == e.tid && s->ts <= e.ts && e.ts + e.dur <= s->ts + s->dur;
    CHECK(parents == 1);
  }
  CHECK(steps == replayed);
  CHECK(step_counts.size() == static_cast<size_t>(fwd + bwd));
  for (const auto& [key, n] : step_counts) CHECK(n == kCalls - 1);
  // Every backward replay lies within an autograd backward pass.
  for (const TraceEvent* s : bwd_spans) {
    int passes = 0;
    for (const TraceEvent& e : events)
      passes += e.cat == "autograd_backward" && e.ts <= s->ts && s->ts + s->dur <= e.ts + e.dur;
    CHECK(passes >= 1);
  }
}

TEST_CASE("each thread records into its own buffer and the profile merges them", "[profiler]") {
  const Tensor x = rand({3});
  const Tensor w = rand({3});
  prof::start();
  eager_rounds(x, w, 2);
  std::thread other([&] { eager_rounds(x, w, 3); });
  other.join();
  const prof::Profile p = prof::stop();
  CHECK(p.calls("relu", prof::Mode::Eager) == 5);
  CHECK(p.total_calls() == 15);
  std::map<uint32_t, int> per_thread;
  for (const prof::Event& e : p.events()) ++per_thread[e.tid];
  REQUIRE(per_thread.size() == 2);
  std::vector<int> counts;
  for (const auto& [tid, n] : per_thread) counts.push_back(n);
  std::sort(counts.begin(), counts.end());
  CHECK(counts == std::vector<int>{6, 9});
  // The trace names both threads.
  const std::string trace = p.chrome_trace();
  CHECK(read_trace(trace).size() == 15);
  CHECK_THAT(trace, Contains("\"thread_name\""));
}

TEST_CASE("past max_events, events are dropped and counted while the counts stay exact",
          "[profiler]") {
  const Tensor x = rand({3});
  const Tensor w = rand({3});
  prof::start({.max_events = 5});
  eager_rounds(x, w, 4);
  const prof::Profile p = prof::stop();
  CHECK(p.total_calls() == 12);
  CHECK(p.calls("relu", prof::Mode::Eager) == 4);
  CHECK(p.events().size() == 5);
  CHECK(p.dropped_events() == 7);
  CHECK_THAT(p.table(), Contains("7 trace events dropped"));
  CHECK_THAT(p.chrome_trace(), Contains("\"dropped_events\": 7"));
}

TEST_CASE("shapes can be left out, and the table can be cut to its largest rows", "[profiler]") {
  const Tensor x = rand({3});
  const Tensor w = rand({3});
  prof::start({.record_shapes = false});
  eager_rounds(x, w, 2);
  const prof::Profile p = prof::stop();
  REQUIRE(p.events().size() == 6);
  for (const prof::Event& e : p.events()) CHECK(e.args.empty());
  const std::string cut = p.table(1);
  CHECK_THAT(cut, Contains("2 more rows"));
}

TEST_CASE("a span name that is not well-formed UTF-8 leaves the trace valid JSON", "[profiler]") {
  prof::Scope scope;
  { prof::Range r("bad \xff, cut \xc3, fine \xc3\xa9"); }
  const nlohmann::json trace = nlohmann::json::parse(scope.stop().chrome_trace());  // throws if not
  bool found = false;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("cat") && e["cat"] == "user") {
      CHECK(e["name"] == "bad \xef\xbf\xbd, cut \xef\xbf\xbd, fine \xc3\xa9");
      found = true;
    }
  CHECK(found);
}

TEST_CASE("Scope writes its trace at the end of the scope; Range adds a user span", "[profiler]") {
  const std::string path = temp_path("scope.json");
  const Tensor x = rand({5});
  const Tensor w = rand({5});
  {
    prof::Scope scope({}, path);
    prof::Range r("my range");
    eager_rounds(x, w, 1);
  }
  CHECK_FALSE(prof::enabled());
  const std::vector<TraceEvent> events = read_trace(read_file(path));
  std::remove(path.c_str());
  REQUIRE(events.size() == 4);
  const TraceEvent* range = nullptr;
  for (const TraceEvent& e : events)
    if (e.cat == "user") range = &e;
  REQUIRE(range != nullptr);
  CHECK(range->name == "my range");
  for (const TraceEvent& e : events)
    if (&e != range) CHECK((range->ts <= e.ts && e.ts + e.dur <= range->ts + range->dur));

  prof::Scope scope;
  eager_rounds(x, w, 1);
  const prof::Profile p = scope.stop();
  CHECK(p.total_calls() == 3);
  CHECK(scope.stop().total_calls() == 0);
}

TEST_CASE("ENCORE_PROFILE starts a session that writes the trace and the table", "[profiler]") {
  const std::string path = temp_path("env.json");
  const Tensor x = rand({6});
  const Tensor w = rand({6});
  const char* old = std::getenv("ENCORE_PROFILE");
  const std::string saved = old != nullptr ? old : "";
  ::unsetenv("ENCORE_PROFILE");
  CHECK_FALSE(prof::start_from_env());  // unset: nothing starts
  ::setenv("ENCORE_PROFILE", path.c_str(), 1);
  REQUIRE(prof::start_from_env());
  CHECK(prof::enabled());
  CHECK_FALSE(prof::start_from_env());  // already running
  eager_rounds(x, w, 2);
  CHECK(prof::finish_env() == path);
  CHECK_FALSE(prof::enabled());
  CHECK(prof::finish_env().empty());  // once only
  if (old != nullptr)
    ::setenv("ENCORE_PROFILE", saved.c_str(), 1);
  else
    ::unsetenv("ENCORE_PROFILE");

  const std::vector<TraceEvent> events = read_trace(read_file(path));
  CHECK(events.size() == 6);
  const std::string table = read_file(path + ".txt");
  CHECK_THAT(table, Contains("per call us") && Contains("eager   relu"));
  std::remove(path.c_str());
  std::remove((path + ".txt").c_str());
}

// Run by the next test in a child process started with ENCORE_PROFILE set.
TEST_CASE("profiler child: seven tanh ops", "[.][profiler_env_child]") {
  const Tensor x = rand({4});
  for (int i = 0; i < 7; ++i) REQUIRE(F::tanh(x).defined());
}

TEST_CASE("ENCORE_PROFILE=path profiles a whole process and writes at exit", "[profiler]") {
  const std::string path = temp_path("child.json");
  std::remove(path.c_str());
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  exe[n] = '\0';
  const std::string cmd =
      cat("ENCORE_PROFILE='", path, "' '", exe, "' '[profiler_env_child]' > /dev/null 2>&1");
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::vector<TraceEvent> events = read_trace(read_file(path));
  int tanh_events = 0;
  for (const TraceEvent& e : events) tanh_events += e.name == "tanh" && e.cat == "eager";
  CHECK(tanh_events == 7);
  const std::string table = read_file(path + ".txt");
  CHECK_THAT(table, Contains("         7") && Contains("eager   tanh"));
  std::remove(path.c_str());
  std::remove((path + ".txt").c_str());
}
