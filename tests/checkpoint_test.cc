// Checkpoints: the safetensors layout and names, round trips, and every malformed or mismatched
// file raising an Error that names the file and the tensor while changing nothing.
#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint_util.h"

using namespace encore;
using namespace encore::testing;
using Json = nlohmann::json;

namespace {

// The header and the data of a checkpoint file.
struct Parts {
  Json header;
  std::vector<char> data;
};

Parts split(const std::vector<char>& bytes) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  Parts p;
  p.header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(length));
  p.data.assign(bytes.begin() + 8 + static_cast<int64_t>(length), bytes.end());
  return p;
}

std::vector<char> join(const std::string& header, const std::vector<char>& data) {
  const uint64_t length = header.size();
  std::vector<char> out(8 + header.size() + data.size());
  std::memcpy(out.data(), &length, 8);
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

struct Fixture {
  TempPath dir{"errors"};
  std::string good = dir.file("good.safetensors");
  std::string bad = dir.file("bad.safetensors");
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Adam> opt;
  Generator gen{5};

  Fixture() {
    manual_seed(3);
    auto source = nn::mlp(4, 6, 3);
    optim::Adam source_opt(source->parameters());
    Tensor loss = F::softmax_cross_entropy((*source)(randn({5, 4})), zeros({5}, DType::Int64));
    loss.backward();
    source_opt.step();
    Generator source_gen(77);
    source_gen.reserve(40);
    save(good, *source, &source_opt, &source_gen);
    model = nn::mlp(4, 6, 3);
    opt = std::make_unique<optim::Adam>(model->parameters());
  }

  // Loads `bytes` and returns the message; checks that nothing changed.
  std::string fails(const std::vector<char>& bytes, LoadOptions options = {}) {
    write_bytes(bad, bytes);
    const Snapshot before(*model, opt.get(), &gen);
    const std::string message = error_of([&] { load(bad, *model, opt.get(), &gen, options); });
    CHECK(Snapshot(*model, opt.get(), &gen).diff(before) == "");
    CHECK_THAT(message, Catch::Contains(bad));
    return message;
  }
  std::string fails(const Json& header, const std::vector<char>& data) {
    return fails(join(header.dump(), data));
  }
};

}  // namespace

TEST_CASE("checkpoint: the file is safetensors with module, optimizer and generator entries",
          "[checkpoint]") {
  Fixture f;
  const std::vector<char> bytes = read_bytes(f.good);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  CHECK(length % 8 == 0);
  const Parts p = split(bytes);
  const Json& meta = p.header["__metadata__"];
  CHECK(meta["format"] == "encore.checkpoint");
  CHECK(meta["format_version"] == "1");
  CHECK(meta["optimizer.kind"] == "Adam");
  CHECK(meta["optimizer.steps"] == "1");
  CHECK(meta["optimizer.lr"] == "0.001");
  CHECK(meta["optimizer.decoupled"] == "0");
  CHECK(meta["generator.seed"] == "77");
  CHECK(meta["generator.offset"] == "40");
  CHECK(p.header["0.weight"]["dtype"] == "F32");
  CHECK(p.header["0.weight"]["shape"] == Json::array({6, 4}));
  CHECK(p.header["optimizer.0.m"]["shape"] == Json::array({6, 4}));
  CHECK(p.header["optimizer.5.t"]["dtype"] == "I64");
  CHECK(p.header["optimizer.5.t"]["shape"] == Json::array());
  // 6 parameters; Adam's m, v and t for each; the metadata.
  CHECK(p.header.size() == 6 + 18 + 1);
  // The data of 0.weight is the module's, little-endian float32.
  const auto& off = p.header["0.weight"]["data_offsets"];
  REQUIRE(off[1].get<uint64_t>() - off[0].get<uint64_t>() == 24 * 4);
  float first = 0;
  std::memcpy(&first, p.data.data() + off[0].get<uint64_t>(), 4);
  f.model->eval();  // load into a fresh model: the same bits
  load(f.good, *f.model, f.opt.get(), &f.gen);
  CHECK(first == (*f.model)[0].named_parameters()[0].second.data<float>()[0]);
  CHECK(f.opt->steps() == 1);
  CHECK(f.gen.state() == Generator::Stream{77, 40});
  // Nothing left beside the file (the temporary was renamed over it).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(f.dir.dir())) files += e.exists();
  CHECK(files == 1);
}

TEST_CASE("checkpoint: batch-norm running statistics are saved as buffers", "[checkpoint]") {
  TempPath dir("buffers");
  const std::string path = dir.file("bn.safetensors");
  manual_seed(0);
  auto bn = std::make_shared<nn::BatchNorm2d>(3);
  (*bn)(randn({4, 3, 2, 2}));  // moves the running statistics off their initial values
  save(path, *bn);
  const Json header = split(read_bytes(path)).header;
  CHECK(header.contains("running_mean"));
  CHECK(header.contains("running_var"));
  auto fresh = std::make_shared<nn::BatchNorm2d>(3);
  const Snapshot before(*fresh, nullptr, nullptr);
  load(path, *fresh);
  CHECK(Snapshot(*fresh, nullptr, nullptr).diff(Snapshot(*bn, nullptr, nullptr)) == "");
  CHECK(Snapshot(*fresh, nullptr, nullptr).diff(before) != "");
}

TEST_CASE("checkpoint: an AdamW checkpoint made coupled does not load", "[checkpoint]") {
  TempPath dir{"adamw"};
  manual_seed(3);
  auto model = nn::mlp(4, 6, 3);
  optim::AdamW opt(model->parameters(), {.weight_decay = 0.5});
  const std::string path = dir.file("adamw.safetensors");
  save(path, *model, &opt);
  Parts p = split(read_bytes(path));
  REQUIRE(p.header["__metadata__"]["optimizer.decoupled"] == "1");
  p.header["__metadata__"]["optimizer.decoupled"] = "0";
  write_bytes(path, join(p.header.dump(), p.data));
  // It loaded, and the AdamW (kind() "AdamW") went on with Adam's coupled L2 decay.
  const Snapshot before(*model, &opt, nullptr);
  CHECK_THAT(error_of([&] { load(path, *model, &opt); }),
             Catch::Contains(path) &&
                 Catch::Contains("hyper-parameters: AdamW: decoupled must be 1, got 0"));
  CHECK(Snapshot(*model, &opt, nullptr).diff(before) == "");
  CHECK(opt.options.decoupled);
}

TEST_CASE("checkpoint: saving replaces the file whole", "[checkpoint]") {
  Fixture f;
  save(f.good, *f.model);  // over the old checkpoint; the optimizer entries are gone
  const Json header = split(read_bytes(f.good)).header;
  CHECK_FALSE(header.contains("optimizer.0.m"));
  CHECK_THAT(error_of([&] { save(f.dir.file("no/such/dir/x.safetensors"), *f.model); }),
             Catch::Contains("no/such/dir/x.safetensors"));
}

TEST_CASE("checkpoint: a damaged file is an Error naming it, and changes nothing", "[checkpoint]") {
  Fixture f;
  const std::vector<char> good = read_bytes(f.good);
  const Parts p = split(good);

  CHECK_THAT(error_of([&] { load(f.dir.file("absent"), *f.model); }),
             Catch::Contains("cannot open"));
  {
    const Snapshot before(*f.model, f.opt.get(), &f.gen);
    CHECK_THAT(error_of([&] { load(f.dir.dir().string(), *f.model, f.opt.get(), &f.gen); }),
               Catch::Contains("load: checkpoint " + f.dir.dir().string()) &&
                   Catch::Contains("not a regular file (a directory)"));
    CHECK(Snapshot(*f.model, f.opt.get(), &f.gen).diff(before) == "");
  }
  CHECK_THAT(f.fails(std::vector<char>(good.begin(), good.begin() + 5)),
             Catch::Contains("truncated"));
  std::vector<char> long_header = good;
  long_header[6] = 1;  // a header length of 2^48
  CHECK_THAT(f.fails(long_header), Catch::Contains("runs past the end"));
  CHECK_THAT(f.fails(std::vector<char>(good.begin(), good.end() - 1)),
             Catch::Contains("data_offsets"));
  CHECK_THAT(f.fails(join("{\"a\": [1,", p.data)), Catch::Contains("not valid JSON"));
  CHECK_THAT(f.fails(join("[1, 2]", {})), Catch::Contains("not a JSON object"));

  Json h = p.header;
  h["0.weight"]["dtype"] = "F8_E4M3";
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("'0.weight': unknown dtype \"F8_E4M3\""));
  h = p.header;
  h["0.weight"]["shape"] = {6, -4};
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("'0.weight': shape holds -4"));
  h = p.header;
  h["0.bias"]["data_offsets"][1] = p.data.size() + 8;
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("'0.bias': data_offsets"));
  h = p.header;  // two tensors on the same bytes
  h["0.bias"]["data_offsets"] = h["optimizer.0.t"]["data_offsets"];
  h["0.bias"]["dtype"] = "I64";
  h["0.bias"]["shape"] = Json::array();
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("overlaps"));
  std::vector<char> padded = p.data;
  padded.resize(padded.size() + 4);
  CHECK_THAT(f.fails(p.header, padded), Catch::Contains("belong to no tensor"));
  h = p.header;
  h["__metadata__"]["format_version"] = "2";
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("format_version '2'"));
  h = p.header;
  h["__metadata__"]["optimizer.steps"] = 3;
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("'optimizer.steps' is 3, not a string"));
  h = p.header;
  h["__metadata__"]["optimizer.lr"] = "fast";
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("'optimizer.lr' is 'fast'"));
  h = p.header;
  h["__metadata__"]["optimizer.beta2"] = "1.5";
  CHECK_THAT(f.fails(h, p.data),
             Catch::Contains("hyper-parameters: Adam: beta2 must be in [0, 1), got 1.5"));
  h = p.header;
  h["__metadata__"]["optimizer.weight_decay"] = "-1";
  CHECK_THAT(f.fails(h, p.data),
             Catch::Contains("hyper-parameters: Adam: weight_decay must be non-negative, got -1"));
  h = p.header;
  h["__metadata__"].erase("generator.offset");
  CHECK_THAT(f.fails(h, p.data), Catch::Contains("generator.offset"));

  // Values nested past a few levels are named, not printed (printing one recurses per level):
  // an entry, a shape's element and a metadata value, 100,000 lists deep.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THAT(f.fails(join("{\"a\":" + deep + "}", {})),
             Catch::Contains("'a': expected {dtype, shape, data_offsets}, found an array nested "
                             "over 8 deep"));
  CHECK_THAT(
      f.fails(join("{\"a\":{\"dtype\":\"F32\",\"shape\":[" + deep + "],\"data_offsets\":[0,4]}}",
                   std::vector<char>(4))),
      Catch::Contains("'a': shape holds an array nested over 8 deep"));
  CHECK_THAT(f.fails(join("{\"__metadata__\":{\"x\":" + deep + "}}", {})),
             Catch::Contains("'x' is an array nested over 8 deep, not a string"));
  // A long value is cut short.
  h = p.header;
  h["0.weight"]["shape"] = Json(std::vector<std::string>(1000, "dim"));
  const std::string cut = f.fails(h, p.data);
  CHECK_THAT(cut, Catch::Contains("'0.weight': shape holds \"dim\""));
  h["0.weight"]["shape"] = Json::array({Json(std::vector<int>(1000, 7)), 1});
  const std::string long_shape = f.fails(h, p.data);
  CHECK_THAT(long_shape, Catch::Contains("shape holds [7,7,7,") && Catch::Contains("..."));
  CHECK(long_shape.size() < 400);

  // A name given twice: the text of the first entry again, renamed over the second.
  std::string text = p.header.dump();
  const std::string second = "\"0.weight\":" + p.header["0.weight"].dump();
  REQUIRE(text.find(second) != std::string::npos);
  text.replace(text.find(second), second.size(), "\"0.bias\":" + p.header["0.weight"].dump());
  CHECK_THAT(f.fails(join(text, p.data)), Catch::Contains("names '0.bias' twice"));
}

TEST_CASE("checkpoint: a file that does not fit the module is an Error naming the tensor",
          "[checkpoint]") {
  Fixture f;
  auto check_unchanged_error = [&](nn::Module& m, optim::Optimizer* opt,
                                   const std::string& expected) {
    const Snapshot before(m, opt, &f.gen);
    const std::string message = error_of([&] { load(f.good, m, opt, &f.gen); });
    CHECK_THAT(message, Catch::Contains(f.good) && Catch::Contains(expected));
    CHECK(Snapshot(m, opt, &f.gen).diff(before) == "");
  };
  auto wider = nn::mlp(4, 7, 3);
  check_unchanged_error(*wider, nullptr,
                        "tensor '0.weight' is F32 [6,4] in the file but F32 [7,4]");
  auto f64 = nn::mlp(4, 6, 3, {.dtype = DType::Float64});
  check_unchanged_error(*f64, nullptr, "tensor '0.weight' is F32 [6,4] in the file but F64");
  auto deeper = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(6, 6), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(6, 3), std::make_shared<nn::Linear>(3, 3)});
  check_unchanged_error(*deeper, nullptr, "tensor '5.weight' of the module is not in the file");
  auto shallower = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(6, 6)});
  check_unchanged_error(*shallower, nullptr, "tensor '4.bias' is in the file but not");
  optim::MomentumSGD sgd(f.model->parameters());
  check_unchanged_error(*f.model, &sgd, "the optimizer state is Adam's, not MomentumSGD's");

  // An optimizer defined outside encore that does not describe its state cannot take part.
  struct Custom : optim::Optimizer {
    using Optimizer::Optimizer;
    void step() override {}
  } custom(f.model->parameters());
  check_unchanged_error(*f.model, &custom, "the optimizer has no kind()");
  CHECK_THAT(error_of([&] { save(f.good, *f.model, &custom); }),
             Catch::Contains("save: checkpoint") && Catch::Contains("has no kind()"));
  // The file's optimizer entries are ignored when no optimizer is given.
  CHECK(load(f.good, *f.model).unexpected.empty());
  // Non-strict: what matches is loaded, the rest is reported.
  const LoadResult r = load(f.good, *deeper, nullptr, nullptr, {.strict = false});
  CHECK(r.missing == std::vector<std::string>{"5.weight", "5.bias"});
  CHECK(r.unexpected.empty());
  CHECK(Snapshot((*deeper)[0], nullptr, nullptr).diff(Snapshot((*f.model)[0], nullptr, nullptr)) ==
        "");
  const LoadResult s = load(f.good, *shallower, nullptr, nullptr, {.strict = false});
  CHECK(s.missing.empty());
  CHECK(s.unexpected == std::vector<std::string>{"4.bias", "4.weight"});
}

TEST_CASE("checkpoint: non-strict, a file saved without an optimizer loads the module alone",
          "[checkpoint]") {
  Fixture f;
  const std::string model_only = f.dir.file("model_only.safetensors");
  manual_seed(8);
  auto pretrained = nn::mlp(4, 6, 3);
  save(model_only, *pretrained);
  // The optimizer has state, a step and a learning rate of its own.
  f.opt->options.lr = 0.25;
  Tensor loss = F::softmax_cross_entropy((*f.model)(randn({5, 4})), zeros({5}, DType::Int64));
  loss.backward();
  f.opt->step();
  nn::Sequential none;  // (a Snapshot of the optimizer alone)
  const Snapshot opt_before(none, f.opt.get(), nullptr);
  // Strict, it is an Error, and nothing changes.
  const Snapshot before(*f.model, f.opt.get(), nullptr);
  CHECK_THAT(error_of([&] { load(model_only, *f.model, f.opt.get()); }),
             Catch::Contains("the optimizer's state was not saved"));
  CHECK(Snapshot(*f.model, f.opt.get(), nullptr).diff(before) == "");
  // Non-strict: the module is the file's, the optimizer as it was, its state tensors missing.
  const LoadResult r = load(model_only, *f.model, f.opt.get(), nullptr, {.strict = false});
  CHECK(Snapshot(*f.model, nullptr, nullptr).diff(Snapshot(*pretrained, nullptr, nullptr)) == "");
  CHECK(Snapshot(none, f.opt.get(), nullptr).diff(opt_before) == "");
  CHECK(f.opt->steps() == 1);
  CHECK(f.opt->options.lr == 0.25);
  CHECK(r.unexpected.empty());
  REQUIRE_FALSE(r.missing.empty());
  for (const std::string& name : r.missing) CHECK(name.starts_with("optimizer."));
}

namespace {

// A module with a bool buffer (a mask) and a child named "optimizer".
struct Masked : nn::Module {
  Tensor mask = tensor({1, 0, 1, 0}, {4}, DType::Bool);
  Masked() {
    register_buffer("mask", &mask);
    register_module("optimizer", std::make_shared<nn::Linear>(2, 2));
  }
  Tensor forward(const Tensor& x) override { return x; }
};

}  // namespace

TEST_CASE("checkpoint: a BOOL byte other than 0 or 1 is an Error, and changes nothing",
          "[checkpoint]") {
  TempPath dir{"bools"};
  const std::string path = dir.file("masked.safetensors");
  Masked source;
  save(path, source);
  std::vector<char> bytes = read_bytes(path);
  Parts p = split(bytes);
  const auto at = p.header["mask"]["data_offsets"][0].get<size_t>();
  p.data[at + 1] = 2;
  write_bytes(path, join(p.header.dump(), p.data));
  Masked target;
  fill_(target.mask, 0);
  const Snapshot before(target, nullptr, nullptr);
  CHECK_THAT(error_of([&] { load(path, target); }),
             Catch::Contains("tensor 'mask': BOOL element 1 is the byte 2, not 0 or 1"));
  CHECK(Snapshot(target, nullptr, nullptr).diff(before) == "");
}

TEST_CASE("checkpoint: a module's own tensors named optimizer.* are the module's", "[checkpoint]") {
  // Saved without an optimizer, the file has no optimizer state: a strict load into a module
  // without that child reports them unexpected, and a non-strict one lists them.
  TempPath dir{"prefix"};
  const std::string path = dir.file("masked.safetensors");
  Masked source;
  save(path, source);
  struct MaskOnly : nn::Module {
    Tensor mask = tensor({0, 0, 0, 0}, {4}, DType::Bool);
    MaskOnly() { register_buffer("mask", &mask); }
    Tensor forward(const Tensor& x) override { return x; }
  } target;
  CHECK_THAT(error_of([&] { load(path, target); }),
             Catch::Contains("tensor 'optimizer.bias' is in the file but not in the module"));
  const LoadResult r = load(path, target, nullptr, nullptr, {.strict = false});
  CHECK(r.unexpected == std::vector<std::string>{"optimizer.bias", "optimizer.weight"});
  CHECK(target.mask.to_vector<double>() == std::vector<double>{1, 0, 1, 0});
  // Saved with an optimizer, its state is left alone by a load without one.
  auto model = nn::mlp(2, 3, 2);
  optim::Adam opt(model->parameters());
  save(path, *model, &opt);
  CHECK(load(path, *model).unexpected.empty());
}
