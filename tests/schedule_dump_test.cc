// The schedule dump: text naming each step in order with operands whose arena ranges fit the
// plan's arena, in-place marks on a chain of elementwise ops, random steps, entries not yet
// planned, the module form, and the Graphviz export (one node per step, a cluster per schedule).
#include <catch2/catch.hpp>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The op names of the step lines of one schedule ("forward" or "backward") of the first entry.
std::vector<std::string> step_ops(const std::string& text, const std::string& schedule) {
  std::vector<std::string> ops;
  bool in = false;
  const std::regex step(R"(^\s+(\d+)\s+([a-z_0-9]+)(\s.*)?$)");
  for (const std::string& line : lines_of(text)) {
    if (line.find(schedule + ": ") != std::string::npos) {
      in = true;
      continue;
    }
    if (!in) continue;
    if (line.find("backward: ") != std::string::npos || line.rfind("entry ", 0) == 0) break;
    std::smatch m;
    if (std::regex_match(line, m, step)) {
      CHECK(std::stoi(m[1]) == static_cast<int>(ops.size()));  // numbered in order
      ops.push_back(m[2]);
    }
  }
  return ops;
}

// Every "arena [a,b)" in the text: b within the arena, a < b.
int check_arena_ranges(const std::string& text, int64_t arena_bytes) {
  const std::regex range(R"(arena \[(\d+),(\d+)\))");
  int n = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), range);
       it != std::sregex_iterator(); ++it) {
    const int64_t a = std::stoll((*it)[1]), b = std::stoll((*it)[2]);
    CHECK(a >= 0);
    CHECK(a < b);
    CHECK(b <= arena_bytes);
    ++n;
  }
  return n;
}

int count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

class DumpNet : public nn::Module {
 public:
  DumpNet() : fc(register_module("fc", std::make_shared<nn::Linear>(4, 3))) {}
  Tensor forward(const Tensor& x) override { return F::relu((*fc)(x)); }

  std::shared_ptr<nn::Linear> fc;
  ENCORE_STATIC_GRAPH({.name = "dump_net", .arg_names = {"x"}});
};

}  // namespace

TEST_CASE("the schedule text lists each step in order with its operands and in-place marks",
          "[schedule_dump]") {
  const testing::StaticFusion unfused(false);  // every op its own step, some in place
  auto f = static_graph(
      [](const Tensor& x) {
        Tensor y = F::mul(x, 2.0);
        y = F::add(y, 1.0);
        y = F::tanh(y);
        y = F::sigmoid(y);
        return F::sum(y);
      },
      {.name = "dump_chain", .arg_names = {"x"}});
  Tensor x = rand({16, 8}).set_requires_grad();
  for (int i = 0; i < 3; ++i) {
    f(x).backward();
    x.set_grad(Tensor());
  }
  const StaticStats st = f.stats();
  REQUIRE(st.cache.size() == 1);
  const EntryReport& r = st.cache[0];
  REQUIRE(r.complete);
  CHECK(r.id == 1);

  const std::string text = f.schedule_text();
  INFO(text);
  CHECK_THAT(text, StartsWith("static function 'dump_chain': 1 cache entry"));
  CHECK_THAT(text,
             Contains("entry 1 (traced at call 1, 2 replays): x: float32[16,8] requires_grad"));
  CHECK_THAT(text, Contains(cat("arena ", r.arena_bytes, " bytes (lower bound ",
                                r.lower_bound_bytes, ", naive sum ", r.naive_bytes, ")")));
  const std::vector<std::string> fwd = step_ops(text, "forward");
  const std::vector<std::string> bwd = step_ops(text, "backward");
  CHECK(fwd == std::vector<std::string>{"mul_scalar", "add_scalar", "tanh", "sigmoid", "sum"});
  CHECK(static_cast<int>(fwd.size()) == r.forward_steps);
  CHECK(static_cast<int>(bwd.size()) == r.backward_steps);
  CHECK_THAT(text, Contains(cat("forward: ", r.forward_steps, " steps")));
  CHECK_THAT(text, Contains(cat("backward: ", r.backward_steps, " steps")));
  // Operands: the argument, arena ranges that fit, in-place steps.
  CHECK_THAT(text, Contains("arg 0 'x'"));
  CHECK_THAT(text, Contains("float32[16,8]"));
  CHECK_THAT(text, Contains("scalar 2"));
  CHECK(check_arena_ranges(text, r.arena_bytes) > 0);
  REQUIRE(r.in_place_steps > 0);
  CHECK(count_matches(text, R"(\(in place over in \d\))") == r.in_place_steps);
  CHECK_THAT(text, Contains("[scalar 1; in place]"));
  CHECK_THAT(text, Contains("own storage (result 0)"));
  CHECK_THAT(text, Contains("own storage (gradient 0 for arg 0 'x')"));
  CHECK_THAT(text, Contains("incoming gradient of output 0"));
}

TEST_CASE("the schedule DOT is a digraph with one node per step and a cluster per schedule",
          "[schedule_dump]") {
  const testing::StaticFusion unfused(false);  // every op its own step
  auto f = static_graph([](const Tensor& x) { return F::sum(F::relu(F::mul(x, 3.0))); },
                        {.name = "dump_dot"});
  const Tensor x = rand({5}).set_requires_grad();
  f(x).backward();
  f(x).backward();
  Tensor y;
  {
    NoGradGuard no_grad;  // a second entry: grad mode off, forward only
    y = f(x);
  }
  const StaticStats st = f.stats();
  REQUIRE(st.cache.size() == 2);
  int e1 = 0, e2 = 0;
  for (const EntryReport& r : st.cache) (r.id == 1 ? e1 : e2) = r.forward_steps + r.backward_steps;
  REQUIRE(e1 > 0);
  REQUIRE(e2 == 3);

  const std::string dot = f.schedule_dot();
  INFO(dot);
  CHECK_THAT(dot, StartsWith("digraph \"static function 'dump_dot'\" {"));
  CHECK(count_matches(dot, R"(\n\s+e1_s\d+ \[shape=box)") == e1);
  CHECK(count_matches(dot, R"(\n\s+e2_s\d+ \[shape=box)") == e2);
  CHECK_THAT(dot, Contains("subgraph cluster_e1 {") && Contains("subgraph cluster_e1_forward {") &&
                      Contains("subgraph cluster_e1_backward {") &&
                      Contains("subgraph cluster_e2_forward {"));
  CHECK_THAT(dot, Contains("label=\"backward (0 steps)\""));  // entry 2 has none
  CHECK_THAT(dot, Contains("fwd 1: relu"));
  CHECK_THAT(dot, Contains("[shape=ellipse"));
  CHECK(count_matches(dot, R"(e1_b\d+ -> e1_s\d+)") > 0);  // reads
  CHECK(count_matches(dot, R"(e1_s\d+ -> e1_b\d+)") > 0);  // writes
  // Braces balance and the text ends with the graph.
  CHECK(std::count(dot.begin(), dot.end(), '{') == std::count(dot.begin(), dot.end(), '}'));
  CHECK_THAT(dot, Catch::Matchers::EndsWith("}\n"));
}

TEST_CASE("the schedule dump marks random steps and entries not yet planned", "[schedule_dump]") {
  auto noisy =
      static_graph([](const Tensor& x) { return F::add(x, rand(x.shape())); }, {.name = "noisy"});
  {
    NoGradGuard no_grad;
    noisy(zeros({4}));
    noisy(zeros({4}));
  }
  const std::string text = noisy.schedule_text();
  INFO(text);
  CHECK_THAT(text, Contains("uniform_") && Contains("random"));
  CHECK_THAT(text, Contains("(written in place)"));
  CHECK_THAT(noisy.schedule_dot(), Contains("(random)"));

  auto waiting = static_graph([](const Tensor& x) { return F::relu(x); }, {.name = "waiting"});
  const Tensor y = waiting(rand({3}).set_requires_grad());  // no backward yet
  CHECK_THAT(waiting.schedule_text(), Contains("not planned yet"));
  CHECK_THAT(waiting.schedule_dot(), Contains("e1_none [shape=plaintext"));
  CHECK_THAT(static_graph([](const Tensor& x) { return x; }, {.name = "unused"}).schedule_text(),
             Contains("'unused': 0 cache entries"));
}

TEST_CASE("a module's static forward dumps its schedules with parameter names", "[schedule_dump]") {
  DumpNet net;
  const Tensor x = rand({2, 4});
  for (int i = 0; i < 2; ++i) F::sum(net(x)).backward();
  const std::string text = static_schedule_text(net);
  INFO(text);
  CHECK_THAT(text, StartsWith("static function 'dump_net'"));
  CHECK_THAT(text, Contains("param 'fc.weight'") && Contains("param 'fc.bias'"));
  CHECK_THAT(text, Contains("linear") && Contains("relu"));
  CHECK_THAT(text, Contains("own storage (gradient 0 for param 'fc.weight')"));
  const StaticStats st = static_stats(net);
  REQUIRE(st.cache.size() == 1);
  check_arena_ranges(text, st.cache[0].arena_bytes);
  const std::string dot = static_schedule_dot(net);
  CHECK(count_matches(dot, R"(\n\s+e1_s\d+ \[shape=box)") ==
        st.cache[0].forward_steps + st.cache[0].backward_steps);
  CHECK_THAT(dot, Contains("param 'fc.weight'"));

  nn::Linear plain(2, 2);
  CHECK_THROWS_WITH(static_schedule_text(plain), Contains("no static forward"));
}
