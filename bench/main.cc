// The entry point of encore_bench: Google Benchmark's main with four additions.
//  - The case names are fixed (results are compared across versions), but Google Benchmark
//    appends "/real_time" to a case with UseRealTime() (and "/min_time:..." with MinTime()). A
//    reporter in front of the console and file reporters drops those parts again.
//  - --benchmark_min_time defaults to kDefaultMinTime: a plain run takes about 15 seconds,
//    five repetitions under a minute and a half.
//  - The OpenBLAS thread count and build go into the context printed above the results.
//  - The /cuda cases are registered here, at run time, and only when a CUDA device is
//    available (bench_util.h); the context says how many, or why there are none.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_util.h"

namespace {

constexpr const char* kDefaultMinTime = "--benchmark_min_time=1";

class FixedNameReporter : public benchmark::BenchmarkReporter {
 public:
  explicit FixedNameReporter(benchmark::BenchmarkReporter* inner) : inner_(inner) {}

  bool ReportContext(const Context& context) override {
    // Google Benchmark points this reporter's streams at the output file, if any.
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> renamed = runs;
    for (Run& r : renamed) {
      r.run_name.min_time.clear();
      r.run_name.time_type.clear();
    }
    inner_->ReportRuns(renamed);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
};

// The value of --flag=value in argv (before Initialize() consumes it), or "".
std::string flag_value(int argc, char** argv, std::string_view flag) {
  std::string value;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.size() > flag.size() + 1 && a.starts_with(flag) && a[flag.size()] == '=')
      value = a.substr(flag.size() + 1);
  }
  return value;
}

// JSON unless --benchmark_out_format=console (Google Benchmark's CSV reporter is deprecated).
std::unique_ptr<benchmark::BenchmarkReporter> make_file_reporter(const std::string& format) {
  if (format == "console") return std::make_unique<benchmark::ConsoleReporter>();
  return std::make_unique<benchmark::JSONReporter>();
}

}  // namespace

int main(int argc, char** argv) {
  const bool to_file = !flag_value(argc, argv, "--benchmark_out").empty();
  const std::string out_format = flag_value(argc, argv, "--benchmark_out_format");
  std::vector<char*> args(argv, argv + argc);
  std::string min_time = kDefaultMinTime;
  if (flag_value(argc, argv, "--benchmark_min_time").empty()) args.push_back(min_time.data());
  args.push_back(nullptr);
  int nargs = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&nargs, args.data());
  if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;
  benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
  benchmark::AddCustomContext("cuda", encore::bench::register_cuda_cases());

  FixedNameReporter display(benchmark::CreateDefaultDisplayReporter());
  std::unique_ptr<FixedNameReporter> file;
  if (to_file) file = std::make_unique<FixedNameReporter>(make_file_reporter(out_format).release());
  benchmark::RunSpecifiedBenchmarks(&display, file.get());
  benchmark::Shutdown();
  return 0;
}
