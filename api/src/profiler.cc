#include "encore/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>

#include "runtime/error.h"

namespace encore::profiler {
namespace {

// The length of the well-formed UTF-8 sequence at the start of `s` (0: none is; JSON must not
// hold such bytes).
size_t utf8_length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  const size_t n = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 0;
  if (n == 0 || n > s.size() || (n == 2 && c < 0xc2) || (n == 4 && c > 0xf4)) return 0;
  for (size_t i = 1; i < n; ++i)
    if ((b(i) & 0xc0) != 0x80) return 0;
  // Overlong forms, surrogates and code points past U+10FFFF.
  if ((n == 3 && c == 0xe0 && b(1) < 0xa0) || (n == 3 && c == 0xed && b(1) >= 0xa0) ||
      (n == 4 && c == 0xf0 && b(1) < 0x90) || (n == 4 && c == 0xf4 && b(1) >= 0x90))
    return 0;
  return n;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {  // kept when well formed, else U+FFFD
      const size_t n = utf8_length(s.substr(i));
      if (n == 0) {
        out += "\\ufffd";
      } else {
        out += s.substr(i, n);
        i += n - 1;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Nanoseconds as microseconds with three decimals, exactly (no rounding), so a child's
// interval stays inside its parent's in the file as it did in the clock.
std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  return buf;
}

std::string ms_text(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e6);
  return buf;
}

}  // namespace

Profile::Profile(Recorded r)
    : events_(std::move(r.events)), wall_ns_(r.wall_ns), dropped_(r.dropped) {
  for (const OpStat& s : r.ops) {
    ops_.push_back({std::string(op_name(s.op)), s.mode, s.calls, s.total_ns, 0});
    total_ns_ += s.total_ns;
  }
  for (OpRow& row : ops_)
    row.share =
        total_ns_ > 0 ? static_cast<double>(row.total_ns) / static_cast<double>(total_ns_) : 0;
  std::stable_sort(ops_.begin(), ops_.end(), [](const OpRow& a, const OpRow& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.calls > b.calls;
  });
  for (const SpanStat& s : r.spans)
    spans_.push_back({std::string(s.name), s.kind, s.calls, s.total_ns});
  std::sort(spans_.begin(), spans_.end(), [](const SpanRow& a, const SpanRow& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  std::stable_sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) {
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.dur_ns > b.dur_ns;  // the parent first when both start at once
  });
}

int64_t Profile::calls(std::string_view op, Mode mode) const {
  for (const OpRow& r : ops_)
    if (r.mode == mode && r.op == op) return r.calls;
  return 0;
}

int64_t Profile::total_ns(Mode mode) const {
  int64_t t = 0;
  for (const OpRow& r : ops_)
    if (r.mode == mode) t += r.total_ns;
  return t;
}

int64_t Profile::total_calls() const {
  int64_t n = 0;
  for (const OpRow& r : ops_) n += r.calls;
  return n;
}

std::string Profile::table(int max_rows) const {
  std::string out = cat("encore profile: ", total_calls(), " op calls, ", ms_text(total_ns_),
                        " ms in ops (eager ", ms_text(total_ns(Mode::Eager)), " ms, trace ",
                        ms_text(total_ns(Mode::Trace)), " ms, replay ",
                        ms_text(total_ns(Mode::Replay)), " ms) over ", ms_text(wall_ns_), " ms");
  if (dropped_ > 0) out += cat("; ", dropped_, " trace events dropped (counts stay exact)");
  out += "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%10s %12s %13s %7s  %-7s %s\n", "calls", "total ms",
                "per call us", "share", "mode", "op");
  out += line;
  const size_t n_ops =
      max_rows > 0 ? std::min(ops_.size(), static_cast<size_t>(max_rows)) : ops_.size();
  for (size_t i = 0; i < n_ops; ++i) {
    const OpRow& r = ops_[i];
    std::snprintf(line, sizeof line, "%10lld %12.3f %13.3f %6.1f%%  %-7s %s\n",
                  static_cast<long long>(r.calls), static_cast<double>(r.total_ns) / 1e6,
                  r.per_call_ns() / 1e3, 100.0 * r.share, std::string(mode_name(r.mode)).c_str(),
                  r.op.c_str());
    out += line;
  }
  if (n_ops < ops_.size()) out += cat("  ... ", ops_.size() - n_ops, " more rows\n");
  if (spans_.empty()) return out;
  out += "\nspans\n";
  std::snprintf(line, sizeof line, "%10s %12s %13s  %-17s %s\n", "calls", "total ms", "per call us",
                "kind", "name");
  out += line;
  const size_t n_spans =
      max_rows > 0 ? std::min(spans_.size(), static_cast<size_t>(max_rows)) : spans_.size();
  for (size_t i = 0; i < n_spans; ++i) {
    const SpanRow& r = spans_[i];
    std::snprintf(line, sizeof line, "%10lld %12.3f %13.3f  %-17s %s\n",
                  static_cast<long long>(r.calls), static_cast<double>(r.total_ns) / 1e6,
                  r.calls ? static_cast<double>(r.total_ns) / r.calls / 1e3 : 0.0,
                  std::string(span_kind_name(r.kind)).c_str(), r.name.c_str());
    out += line;
  }
  if (n_spans < spans_.size()) out += cat("  ... ", spans_.size() - n_spans, " more spans\n");
  return out;
}

std::string Profile::chrome_trace() const {
  const long long pid = static_cast<long long>(::getpid());
  std::string out = "{\"traceEvents\": [\n";
  out += cat("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", pid,
             ", \"tid\": 0, \"args\": {\"name\": \"encore\"}}");
  // Collectives in flight go on a lane of their own, after the threads' (tids 1, 2, ...).
  constexpr uint32_t kCommunicationLane = 1000;
  const auto lane = [](const Event& e) {
    return e.is_span && e.kind == SpanKind::Communication ? kCommunicationLane : e.tid;
  };
  if (std::any_of(events_.begin(), events_.end(),
                  [&](const Event& e) { return lane(e) == kCommunicationLane; }))
    out += cat(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": ", pid,
               ", \"tid\": ", kCommunicationLane, ", \"args\": {\"name\": \"communication\"}}");
  uint32_t last_tid = 0;
  for (const Event& e : events_) {
    if (lane(e) != kCommunicationLane && e.tid != last_tid) {
      last_tid = e.tid;
      out += cat(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": ", pid,
                 ", \"tid\": ", e.tid, ", \"args\": {\"name\": \"thread ", e.tid, "\"}}");
    }
    out += cat(",\n{\"name\": ", json_string(e.name), ", \"cat\": \"",
               e.is_span ? span_kind_name(e.kind) : mode_name(e.mode),
               "\", \"ph\": \"X\", \"ts\": ", micros(e.start_ns), ", \"dur\": ", micros(e.dur_ns),
               ", \"pid\": ", pid, ", \"tid\": ", lane(e), ", \"args\": {");
    std::string args;
    if (e.step >= 0)
      args += cat("\"schedule\": \"", e.backward_schedule ? "backward" : "forward",
                  "\", \"step\": ", e.step);
    if (!e.args.empty())
      args += cat(args.empty() ? "" : ", ",
                  e.is_span ? "\"info\": " : "\"shapes\": ", json_string(e.args));
    out += args + "}}";
  }
  out += cat("\n],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": {\"dropped_events\": ", dropped_,
             ", \"op_time_ns\": ", total_ns_, "}}\n");
  return out;
}

void Profile::write_chrome_trace(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  ENCORE_CHECK(f.good(), "profiler: cannot open '", path, "' to write the Chrome trace");
  const std::string text = chrome_trace();
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  ENCORE_CHECK(!f.fail(), "profiler: writing the Chrome trace to '", path, "' failed");
}

void start(const Options& options) {
  start_session(options);
}

Profile stop() {
  return Profile(stop_session());
}

Scope::Scope(const Options& options, std::string trace_path) : trace_path_(std::move(trace_path)) {
  start(options);
}

Scope::~Scope() {
  if (!running_) return;
  Profile p = stop();
  if (trace_path_.empty()) return;
  try {
    p.write_chrome_trace(trace_path_);
  } catch (const Error& e) {
    std::cerr << "encore: " << e.what() << std::endl;
  }
}

Profile Scope::stop() {
  if (!running_) return Profile();
  running_ = false;
  return profiler::stop();
}

Range::Range(std::string_view name) : start_(active() ? ticks() : -1) {
  if (start_ >= 0) name_ = intern(name);
}

Range::~Range() {
  if (start_ >= 0) [[unlikely]]
    record_span(name_, SpanKind::User, start_, {});
}

// ---- ENCORE_PROFILE ---------------------------------------------------------------------

namespace {

std::mutex& env_mutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::string& env_path() {
  static std::string* path = new std::string();
  return *path;
}

void finish_env_at_exit() {
  try {
    finish_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "encore: ENCORE_PROFILE: %s\n", e.what());
  }
}

}  // namespace

bool start_from_env() {
  const char* v = std::getenv("ENCORE_PROFILE");
  if (v == nullptr || *v == '\0') return false;
  std::lock_guard<std::mutex> l(env_mutex());
  if (!env_path().empty() || active()) return false;
  start_session(Options{});
  env_path() = v;
  static const bool registered = std::atexit(finish_env_at_exit) == 0;
  (void)registered;
  return true;
}

std::string finish_env() {
  std::string path;
  {
    std::lock_guard<std::mutex> l(env_mutex());
    path.swap(env_path());
  }
  if (path.empty()) return path;
  const Profile p = stop();
  p.write_chrome_trace(path);
  const std::string txt = path + ".txt";
  std::ofstream f(txt, std::ios::trunc);
  f << p.table();
  std::cerr << p.table(25) << "encore: profile written to " << path << " (Chrome trace) and " << txt
            << " (table)" << std::endl;
  return path;
}

namespace {
[[maybe_unused]] const bool g_env_profile = start_from_env();
}  // namespace

}  // namespace encore::profiler
