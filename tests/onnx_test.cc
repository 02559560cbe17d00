// export_onnx: each reference model's file passes the ONNX checker with the inputs, initializers
// and outputs a user expects; what cannot be exported is an Error naming why. onnxruntime's
// check of the numbers is the onnx_runtime_check test (tests/onnx_runtime/).
#include <unistd.h>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "encore/encore.h"
#include "onnx/checker.h"
#include "onnx/onnx_pb.h"
#include "static_models.h"

namespace encore {
namespace {

namespace fs = std::filesystem;

// A scratch directory removed with the fixture.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("encore_onnx_test_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

onnx::ModelProto read_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  onnx::ModelProto model;
  REQUIRE(model.ParseFromIstream(&in));
  return model;
}

std::set<std::string> initializer_names(const onnx::ModelProto& m) {
  std::set<std::string> names;
  for (const auto& t : m.graph().initializer()) names.insert(t.name());
  return names;
}

std::set<std::string> op_types(const onnx::ModelProto& m) {
  std::set<std::string> ops;
  for (const auto& n : m.graph().node()) ops.insert(n.op_type());
  return ops;
}

// "batch,784" for a graph input or output.
std::string dims_of(const onnx::ValueInfoProto& v) {
  std::string s;
  for (const auto& d : v.type().tensor_type().shape().dim())
    s += (s.empty() ? "" : ",") +
         (d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
  return s;
}

// Exports, checks the file with the ONNX checker, and reads it back.
onnx::ModelProto exported(nn::Module& m, const Scratch& s, const std::string& name,
                          OnnxOptions options) {
  const std::string path = s.path(name);
  export_onnx(m, path, options);
  onnx::checker::check_model(path);
  return read_model(path);
}

Tensor tokens(int64_t batch, int64_t time) {
  return tensor(std::vector<double>(static_cast<size_t>(batch * time), 1.0), {batch, time},
                DType::Int64);
}

struct StaticSeedCnn : models::SeedCnn {
  ENCORE_STATIC_GRAPH({.name = "seed_cnn", .arg_names = {"images"}});
};

}  // namespace

TEST_CASE("SeedCnn exports with its parameters named after the module tree", "[onnx]") {
  Scratch s;
  manual_seed(1);
  models::SeedCnn net(4);
  const bool training = net.is_training();
  const onnx::ModelProto m = exported(net, s, "cnn.onnx", {.example_args = {randn({3, 784})}});
  CHECK(net.is_training() == training);  // the export traced in eval mode, then restored it
  REQUIRE(m.opset_import_size() == 1);
  CHECK(m.opset_import(0).version() == kOnnxOpset);
  REQUIRE(m.graph().input_size() == 1);
  CHECK(m.graph().input(0).name() == "input");
  CHECK(dims_of(m.graph().input(0)) == "batch,784");
  REQUIRE(m.graph().output_size() == 1);
  CHECK(m.graph().output(0).name() == "output");
  CHECK(dims_of(m.graph().output(0)) == "batch,10");
  const std::set<std::string> inits = initializer_names(m);
  for (const char* p : {"c1.weight", "c1.bias", "c2.weight", "c3.bias", "l1.weight", "l1.bias"})
    CHECK(inits.contains(p));
  const std::set<std::string> ops = op_types(m);
  for (const char* op : {"Conv", "Relu", "MaxPool", "Gemm", "Reshape"}) CHECK(ops.contains(op));
}

TEST_CASE("A module's ENCORE_STATIC_GRAPH forward exports its eval entry", "[onnx]") {
  Scratch s;
  manual_seed(2);
  StaticSeedCnn net;
  net.eval();
  {
    NoGradGuard g;
    net(randn({2, 784}));
  }
  const onnx::ModelProto m = exported(net, s, "static_cnn.onnx", {});
  CHECK(m.graph().input(0).name() == "images");
  CHECK(m.graph().name() == "seed_cnn");
  CHECK(initializer_names(m).contains("c1.weight"));
}

TEST_CASE("VggSmall, the MLP and TinyGpt export", "[onnx]") {
  Scratch s;
  manual_seed(3);
  models::VggSmall vgg(3, {4, 8});
  auto vm = exported(vgg, s, "vgg.onnx", {.example_args = {randn({2, 3, 16, 16})}});
  CHECK(dims_of(vm.graph().input(0)) == "batch,3,16,16");
  CHECK(initializer_names(vm).contains("conv1_1.weight"));
  CHECK(initializer_names(vm).contains("head.bias"));
  CHECK(op_types(vm).contains("ReduceMean"));

  testing::StaticMlp mlp(20, 16, 10);
  mlp.eval();
  auto mm = exported(mlp, s, "mlp.onnx", {.example_args = {randn({5, 20})}});
  CHECK(mm.graph().input(0).name() == "x");
  for (const char* p : {"net.0.weight", "net.2.bias", "net.4.weight"})
    CHECK(initializer_names(mm).contains(p));

  models::TinyGpt gpt(11, 8, 16, 2, 1);
  auto gm = exported(gpt, s, "gpt.onnx", {.example_args = {tokens(3, 5)}});
  CHECK(dims_of(gm.graph().input(0)) == "batch,5");
  CHECK(dims_of(gm.graph().output(0)) == "batch,5,11");
  for (const char* p : {"token.weight", "position.weight", "block0.attn.in_proj_weight",
                        "block0.ln1.weight", "norm.bias", "head.weight"})
    CHECK(initializer_names(gm).contains(p));
  const std::set<std::string> ops = op_types(gm);
  for (const char* op : {"Gather", "LayerNormalization", "Softmax", "Where", "Tanh", "Transpose"})
    CHECK(ops.contains(op));
}

TEST_CASE("Exporting gives every module back its own mode", "[onnx]") {
  // A training model with its dropout off, and an eval model with one module training:
  // each module ends the export in the mode it began it in.
  Scratch s;
  manual_seed(4);
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 6), std::make_shared<nn::Dropout>(0.5),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(6, 2)});
  for (const bool outer : {true, false}) {
    INFO("model training " << outer);
    net->train(outer);
    (*net)[1].train(!outer);
    exported(*net, s, "modes.onnx", {.example_args = {randn({4, 6})}});
    CHECK(net->is_training() == outer);
    CHECK((*net)[0].is_training() == outer);
    CHECK((*net)[1].is_training() == !outer);
    CHECK((*net)[3].is_training() == outer);
  }
}

TEST_CASE("CharLstm's cell exports with its state's batch in dimension 1", "[onnx]") {
  Scratch s;
  manual_seed(4);
  auto lstm = std::make_shared<models::CharLstm>(11, 8, 16);
  auto cell = static_graph(
      [&](const Tensor& t, const Tensor& h, const Tensor& c) { return lstm->forward(t, h, c); },
      {.name = "cell", .arg_names = {"tokens", "h", "c"}, .modules = {lstm}});
  const std::string path = s.path("cell.onnx");
  export_onnx(cell, path,
              {.example_args = {tokens(3, 1), randn({1, 3, 16}), randn({1, 3, 16})},
               .batch_dims = {0, 1, 1},
               .output_names = {"logits", "h_next", "c_next"}});
  onnx::checker::check_model(path);
  const onnx::ModelProto m = read_model(path);
  REQUIRE(m.graph().input_size() == 3);
  CHECK(dims_of(m.graph().input(1)) == "1,batch,16");
  REQUIRE(m.graph().output_size() == 3);
  CHECK(m.graph().output(0).name() == "logits");
  CHECK(dims_of(m.graph().output(2)) == "1,batch,16");
  CHECK(initializer_names(m).contains("lstm.weight_ih_l0"));
}

TEST_CASE("Batch norm in eval mode exports its running statistics; dropout vanishes", "[onnx]") {
  Scratch s;
  manual_seed(5);
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::BatchNorm2d>(4),
      std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::ReLU>()});
  const onnx::ModelProto m = exported(*net, s, "bn.onnx", {.example_args = {randn({2, 3, 8, 8})}});
  CHECK(initializer_names(m).contains("1.running_mean"));
  CHECK(initializer_names(m).contains("1.gamma"));
  CHECK(op_types(m).contains("BatchNormalization"));
}

TEST_CASE("An op with no ONNX form is an Error naming it", "[onnx]") {
  Scratch s;
  auto loss =
      static_graph([](const Tensor& x, const Tensor& t) { return F::mean_squared_error(x, t); },
                   {.name = "loss"});
  REQUIRE_THROWS_WITH(
      export_onnx(loss, s.path("loss.onnx"), {.example_args = {randn({2, 3}), randn({2, 3})}}),
      Catch::Contains("'loss'") && Catch::Contains("mean_squared_error") &&
          Catch::Contains("no ONNX mapping"));
  CHECK_FALSE(fs::exists(s.path("loss.onnx")));
}

TEST_CASE("What would bake the traced batch size in is an Error", "[onnx]") {
  Scratch s;
  auto head = static_graph([](const Tensor& x) { return F::slice(x, 0, 0, 1); }, {.name = "head"});
  REQUIRE_THROWS_WITH(export_onnx(head, s.path("head.onnx"), {.example_args = {randn({4, 3})}}),
                      Catch::Contains("slice") && Catch::Contains("batch"));
  // The same function exports with fixed sizes.
  export_onnx(head, s.path("head.onnx"), {.example_args = {randn({4, 3})}, .batch_dims = {-1}});
  CHECK(dims_of(read_model(s.path("head.onnx")).graph().input(0)) == "4,3");

  // [4, 6] read as [2, 12] halves the batch into one dimension and moves the rest into another.
  auto pairs = static_graph(
      [](const Tensor& x) {
        return F::relu(F::reshape(x, {2, 12}));
      },
      {.name = "pairs"});
  REQUIRE_THROWS_WITH(export_onnx(pairs, s.path("pairs.onnx"), {.example_args = {randn({4, 6})}}),
                      Catch::Contains("relu") && Catch::Contains("mixes the batch"));

  auto twice = static_graph([](const Tensor& x) { return F::relu(x); }, {.name = "relu"});
  REQUIRE_THROWS_WITH(export_onnx(twice, s.path("one.onnx"), {.example_args = {randn({1, 3})}}),
                      Catch::Contains("batch size 1"));
}

TEST_CASE("A broadcast to the batch of a tensor without one takes its shape from the input",
          "[onnx]") {
  // A [1, 3] tensor broadcast to {x.size(0), 3}, and a mean over the batch broadcast back: the
  // Expand's shape must hold the batch the file runs at, not the traced one (onnx_runtime_check
  // runs them at another batch size).
  Scratch s;
  const Tensor cls = randn({1, 3});
  auto fn = static_graph(
      [&](const Tensor& x) {
        const Tensor centred = F::sub(x, F::broadcast_to(F::mean(x, {0}, true), x.shape()));
        return F::concat({F::broadcast_to(cls, {x.size(0), 3}), centred}, 1);
      },
      {.name = "tokens"});
  export_onnx(fn, s.path("b.onnx"), {.example_args = {randn({4, 5})}});
  onnx::checker::check_model(s.path("b.onnx"));
  const onnx::ModelProto m = read_model(s.path("b.onnx"));
  const std::set<std::string> constants = initializer_names(m);
  int expands = 0;
  for (const auto& n : m.graph().node()) {
    if (n.op_type() != "Expand") continue;
    ++expands;
    INFO("Expand " << n.name());
    CHECK_FALSE(constants.contains(n.input(1)));  // a shape made at run time
  }
  CHECK(expands == 2);
  CHECK(dims_of(m.graph().output(0)) == "batch,8");

  // Two new dimensions of the batch size: which one is the batch is unknown.
  auto square = static_graph(
      [&](const Tensor& x) {
        return F::add(F::broadcast_to(cls, {x.size(0), x.size(0), 3}), x);
      },
      {.name = "square"});
  REQUIRE_THROWS_WITH(export_onnx(square, s.path("sq.onnx"), {.example_args = {randn({4, 3})}}),
                      Catch::Contains("'square'") && Catch::Contains("broadcast_to") &&
                          Catch::Contains("broadcasts a tensor [1,3] to [4,4,3] with two new "
                                          "dimensions of the traced batch size 4"));
  CHECK_FALSE(fs::exists(s.path("sq.onnx")));
}

TEST_CASE("Exporting needs an eval entry or example arguments", "[onnx]") {
  Scratch s;
  manual_seed(6);
  auto mlp = std::make_shared<testing::MlpNet>(6, 4, 2);
  auto fn = static_graph([&](const Tensor& x) { return (*mlp)(x); },
                         {.name = "classifier", .modules = {mlp}});
  fn(randn({2, 6}));  // train mode, grad on: not an inference forward
  REQUIRE_THROWS_WITH(export_onnx(fn, s.path("c.onnx")),
                      Catch::Contains("'classifier'") && Catch::Contains("no eval entry"));
  mlp->eval();
  {
    NoGradGuard g;  // with grad mode on, a forward's entry waits for its backward
    fn(randn({2, 6}));
  }
  export_onnx(fn, s.path("c.onnx"));
  onnx::checker::check_model(s.path("c.onnx"));

  nn::Linear plain(3, 2);
  REQUIRE_THROWS_WITH(export_onnx(plain, s.path("p.onnx")), Catch::Contains("example_args"));
  REQUIRE_THROWS_WITH(
      export_onnx(plain, s.path("missing/dir/p.onnx"), {.example_args = {randn({2, 3})}}),
      Catch::Contains("missing/dir/p.onnx"));
}

TEST_CASE("More input or output names than the function has is an Error", "[onnx]") {
  Scratch s;
  auto mlp = nn::mlp(6, 8, 3);
  mlp->eval();
  const Tensor x = randn({4, 6});
  REQUIRE_THROWS_WITH(
      export_onnx(*mlp, s.path("in.onnx"), {.example_args = {x}, .input_names = {"a", "b"}}),
      Catch::Contains("OnnxOptions::input_names names 2 inputs; the function takes 1"));
  CHECK_FALSE(fs::exists(s.path("in.onnx")));
  REQUIRE_THROWS_WITH(
      export_onnx(*mlp, s.path("out.onnx"), {.example_args = {x}, .output_names = {"a", "b"}}),
      Catch::Contains("OnnxOptions::output_names names 2 outputs; the function returns 1"));
  CHECK_FALSE(fs::exists(s.path("out.onnx")));
  const onnx::ModelProto m =
      exported(*mlp, s, "named.onnx", {.example_args = {x}, .input_names = {"features"}});
  CHECK(m.graph().input(0).name() == "features");
}

}  // namespace encore
