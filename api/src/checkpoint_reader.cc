// encore::load: reads and checks a whole safetensors checkpoint, then applies it
// (encore/checkpoint.h). Nothing is written before every check has passed.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/src/checkpoint_format.h"
#include "encore/checkpoint.h"
#include "runtime/cuda.h"

namespace encore {

namespace {

using Json = nlohmann::json;

struct Entry {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;  // in the data after the header
};

struct File {
  std::string path;
  std::vector<char> bytes;
  uint64_t data_start = 0;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;

  const char* data(const Entry& e) const { return bytes.data() + data_start + e.begin; }
};

template <typename... Parts>
[[noreturn]] void bad(const File& f, const Parts&... parts) {
  fail("load: checkpoint ", f.path, ": ", parts...);
}

std::vector<char> read_all(const std::string& path) {
  // An ifstream opens a directory, and its tellg is then a huge size.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  ENCORE_CHECK(ec || !std::filesystem::exists(status) || std::filesystem::is_regular_file(status),
               "load: checkpoint ", path, ": not a regular file",
               std::filesystem::is_directory(status) ? " (a directory)" : "");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  ENCORE_CHECK(in.good(), "load: checkpoint ", path, ": cannot open (", std::strerror(errno), ")");
  const std::streamoff size = in.tellg();
  ENCORE_CHECK(size >= 0, "load: checkpoint ", path, ": cannot read its size");
  std::vector<char> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(bytes.data(), size);
  ENCORE_CHECK(in.gcount() == size, "load: checkpoint ", path, ": cannot read all ", size,
               " bytes");
  return bytes;
}

// Parses the header; a name given twice in any object is an Error (nlohmann keeps the last).
Json parse_header(const File& f, std::string_view text) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto note = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == Json::parse_event_t::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), note);
  } catch (const Json::exception& e) {
    bad(f, "the header is not valid JSON (", e.what(), ")");
  }
  if (!duplicate.empty()) bad(f, "the header names '", duplicate, "' twice");
  if (!header.is_object()) bad(f, "the header is not a JSON object");
  return header;
}

// A header value as an error shows it: its JSON, cut short past kShown characters. A value nested
// deeper than kShownDepth is only named (dumping one recurses once per level: a crafted header of
// nested lists would overflow the stack).
std::string shown(const Json& v) {
  constexpr size_t kShown = 80;
  constexpr int kShownDepth = 8;
  std::vector<std::pair<const Json*, int>> todo{{&v, 0}};
  while (!todo.empty()) {
    const auto [j, depth] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    if (depth == kShownDepth)
      return cat("an ", v.type_name(), " nested over ", kShownDepth, " deep");
    for (const Json& child : *j) todo.emplace_back(&child, depth + 1);
  }
  std::string text = v.dump();
  if (text.size() > kShown) text = text.substr(0, kShown - 3) + "...";
  return text;
}

uint64_t read_uint(const File& f, const std::string& name, const char* field, const Json& v) {
  if (!v.is_number_unsigned())
    bad(f, "tensor '", name, "': ", field, " holds ", shown(v), ", not a non-negative integer");
  return v.get<uint64_t>();
}

Entry read_entry(const File& f, const std::string& name, const Json& j, uint64_t data_size) {
  if (!j.is_object() || j.size() != 3 || !j.contains("dtype") || !j.contains("shape") ||
      !j.contains("data_offsets"))
    bad(f, "tensor '", name, "': expected {dtype, shape, data_offsets}, found ", shown(j));
  Entry e{};
  const Json& dtype = j["dtype"];
  const auto d =
      dtype.is_string() ? checkpoint::dtype_from_code(dtype.get<std::string>()) : std::nullopt;
  if (!d) bad(f, "tensor '", name, "': unknown dtype ", shown(dtype));
  e.dtype = *d;
  const Json& shape = j["shape"];
  if (!shape.is_array()) bad(f, "tensor '", name, "': shape ", shown(shape), " is not a list");
  uint64_t numel = 1;
  bool empty = false;
  for (const Json& dim : shape) {
    const uint64_t n = read_uint(f, name, "shape", dim);
    if (n > static_cast<uint64_t>(Shape::kMaxNumel)) bad(f, "tensor '", name, "': shape too large");
    e.shape.push_back(static_cast<int64_t>(n));
    empty = empty || n == 0;
  }
  for (int64_t n : e.shape) {
    if (empty) break;
    if (numel > data_size / static_cast<uint64_t>(n))
      bad(f, "tensor '", name, "': shape ", shown(shape), " holds more than the file's ", data_size,
          " bytes of data");
    numel *= static_cast<uint64_t>(n);
  }
  if (empty) numel = 0;
  const Json& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    bad(f, "tensor '", name, "': data_offsets ", shown(offsets), " is not [begin, end]");
  e.begin = read_uint(f, name, "data_offsets", offsets[0]);
  e.end = read_uint(f, name, "data_offsets", offsets[1]);
  if (e.begin > e.end || e.end > data_size)
    bad(f, "tensor '", name, "': data_offsets [", e.begin, ", ", e.end,
        ") are out of the data's range [0, ", data_size, ")");
  if (e.end - e.begin != numel * itemsize(e.dtype))
    bad(f, "tensor '", name, "': data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin,
        " bytes, but ", checkpoint::dtype_code(e.dtype), " ", shown(shape), " needs ",
        numel * itemsize(e.dtype));
  return e;
}

// The tensors must cover the data exactly, one after another, without overlaps or gaps.
void check_coverage(const File& f, uint64_t data_size) {
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [name, e] : f.entries)
    if (e.end > e.begin) order.emplace_back(e.begin, &name);
  std::sort(order.begin(), order.end());
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i].first < f.entries.at(*order[i - 1].second).end)
      bad(f, "tensor '", *order[i].second, "': its data overlaps that of '", *order[i - 1].second,
          "'");
  uint64_t at = 0;
  for (const auto& [begin, name] : order) {
    if (begin > at)
      bad(f, "tensor '", *name, "': bytes [", at, ", ", begin, ") before it belong to no tensor");
    at = f.entries.at(*name).end;
  }
  if (at != data_size) bad(f, "bytes [", at, ", ", data_size, ") at the end belong to no tensor");
}

File read_file(const std::string& path) {
  File f;
  f.path = path;
  f.bytes = read_all(path);
  const uint64_t size = f.bytes.size();
  if (size < 8) bad(f, "truncated: ", size, " bytes, but the header length alone takes 8");
  uint64_t length = 0;
  std::memcpy(&length, f.bytes.data(), 8);
  if (length > size - 8)
    bad(f, "the header length ", length, " runs past the end of the file (", size, " bytes)");
  f.data_start = 8 + length;
  const uint64_t data_size = size - f.data_start;
  const Json header = parse_header(f, std::string_view(f.bytes.data() + 8, length));
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) bad(f, "__metadata__ is not an object of strings");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) bad(f, "__metadata__ '", key, "' is ", shown(v), ", not a string");
        f.metadata[key] = v.get<std::string>();
      }
    } else {
      f.entries[name] = read_entry(f, name, value, data_size);
    }
  }
  check_coverage(f, data_size);
  // A bool is one byte, 0 or 1: any other byte read as a bool is undefined behaviour.
  for (const auto& [name, e] : f.entries)
    if (e.dtype == DType::Bool)
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        if (const auto byte = static_cast<unsigned char>(f.data(e)[i]); byte > 1)
          bad(f, "tensor '", name, "': BOOL element ", i, " is the byte ", static_cast<int>(byte),
              ", not 0 or 1");
  if (auto v = f.metadata.find("format_version");
      v != f.metadata.end() && v->second != checkpoint::kFormatVersion)
    bad(f, "format_version '", v->second, "' is not ", checkpoint::kFormatVersion);
  return f;
}

const std::string& need(const File& f, const std::string& key, const char* why) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) bad(f, "__metadata__ has no '", key, "' (", why, ")");
  return it->second;
}

struct Plan {
  std::vector<std::pair<const checkpoint::Target*, const Entry*>> copies;
  bool optimizer = false;  // the optimizer's hyper-parameters and step count are loaded
  std::vector<std::pair<std::string, double>> hyper_parameters;
  int64_t steps = 0;
  Generator::Stream stream{};
};

// Every check: on return, applying the plan cannot fail.
Plan plan(const File& f, const std::vector<checkpoint::Target>& targets,
          optim::Optimizer* optimizer, Generator* generator, LoadResult& result, bool strict) {
  Plan p;
  const std::string prefix(checkpoint::kOptimizerPrefix);
  // Non-strict, a file saved without an optimizer loads into the module alone: the optimizer's
  // state comes back missing, and it keeps its hyper-parameters and step count.
  p.optimizer = optimizer && (strict || f.metadata.contains(prefix + "kind"));
  if (p.optimizer) {
    const std::string& kind = need(f, prefix + "kind", "the optimizer's state was not saved");
    if (kind != optimizer->kind())
      bad(f, "the optimizer state is ", kind, "'s, not ", optimizer->kind(), "'s");
  }
  std::set<std::string> taken;
  for (const checkpoint::Target& t : targets) {
    auto it = f.entries.find(t.name);
    if (it == f.entries.end()) {
      if (t.tensor->defined()) result.missing.push_back(t.name);
      continue;
    }
    const Entry& e = it->second;
    if (e.dtype != t.dtype ||
        !std::equal(e.shape.begin(), e.shape.end(), t.shape.begin(), t.shape.end()))
      bad(f, "tensor '", t.name, "' is ", checkpoint::dtype_code(e.dtype), " ",
          Json(e.shape).dump(), " in the file but ", checkpoint::dtype_code(t.dtype), " ",
          Json(std::vector<int64_t>(t.shape.begin(), t.shape.end())).dump(), " in the ",
          t.name.starts_with(checkpoint::kOptimizerPrefix) ? "optimizer" : "module");
    taken.insert(t.name);
    p.copies.emplace_back(&t, &e);
  }
  // Without an optimizer to load, the file's optimizer state is left alone; a file saved with
  // none has no such state (a module's own "optimizer." tensors are the module's).
  const bool skips_state = !optimizer && f.metadata.contains(prefix + "kind");
  for (const auto& [name, e] : f.entries)
    if (!taken.count(name) && !(skips_state && name.starts_with(prefix)))
      result.unexpected.push_back(name);
  if (strict && !result.missing.empty())
    bad(f, "tensor '", result.missing.front(), "' of the ",
        result.missing.front().starts_with(checkpoint::kOptimizerPrefix) ? "optimizer" : "module",
        " is not in the file (", result.missing.size(),
        " missing; LoadOptions::strict = false "
        "loads the rest)");
  if (strict && !result.unexpected.empty())
    bad(f, "tensor '", result.unexpected.front(), "' is in the file but not in the ",
        optimizer ? "module or the optimizer" : "module", " (", result.unexpected.size(),
        " unexpected; LoadOptions::strict = false ignores them)");
  if (p.optimizer) {
    const std::string& steps = need(f, prefix + "steps", "the optimizer's step count");
    const auto n = checkpoint::parse_int(steps);
    if (!n || *n < 0) bad(f, "__metadata__ '", prefix, "steps' is '", steps, "'");
    p.steps = *n;
    for (const auto& [name, unused] : optimizer->hyper_parameters()) {
      const std::string& text = need(f, prefix + name, "a hyper-parameter of the optimizer");
      const auto v = checkpoint::parse_double(text);
      if (!v) bad(f, "__metadata__ '", prefix, name, "' is '", text, "', not a number");
      p.hyper_parameters.emplace_back(name, *v);
    }
  }
  if (generator) {
    const std::string& seed = need(f, "generator.seed", "the generator's state was not saved");
    const std::string& offset = need(f, "generator.offset", "the generator's offset");
    const auto s = checkpoint::parse_uint(seed), o = checkpoint::parse_uint(offset);
    if (!s || !o)
      bad(f, "__metadata__ generator.seed '", seed, "' / generator.offset '", offset,
          "' are not unsigned integers");
    p.stream = {*s, *o};
  }
  return p;
}

}  // namespace

LoadResult load(const std::string& path, nn::Module& module, optim::Optimizer* optimizer,
                Generator* generator, LoadOptions options) {
  ENCORE_CHECK(!optimizer || !optimizer->kind().empty(), "load: checkpoint ", path,
               ": the optimizer has no kind() (one defined outside encore must name its kind, "
               "hyper-parameters and state to be saved or loaded)");
  const File f = read_file(path);
  const std::vector<checkpoint::Target> targets = checkpoint::targets(module, optimizer);
  LoadResult result;
  const Plan p = plan(f, targets, optimizer, generator, result, options.strict);

  // First, as the optimizer checks the values (an Error leaves it unchanged).
  if (p.optimizer) {
    try {
      optimizer->set_hyper_parameters(p.hyper_parameters);
    } catch (const Error& e) {
      bad(f, "the optimizer's hyper-parameters: ", e.what());
    }
    optimizer->set_steps(p.steps);
  }
  for (const auto& [t, e] : p.copies) {
    if (!t->tensor->defined()) *t->tensor = zeros(t->shape, t->dtype, t->device);
    Tensor& x = *t->tensor;
    cuda::copy_bytes(x.raw_data(), x.device(), f.data(*e), Device::cpu(), e->end - e->begin);
    x.impl()->storage->bump_version();
  }
  if (generator) generator->set_state(p.stream);
  return result;
}

}  // namespace encore
