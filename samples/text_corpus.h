// A character corpus for samples/char_lm: the fortune files of Debian's `fortunes` package (plain
// text, entries separated by lines holding "%"), read into one string of 96 symbols (newline and
// printable ASCII; tabs become spaces, other bytes are dropped), with a held-out tail, and the
// two ways of batching it: fixed windows and real lines of varying length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "encore/encore.h"

namespace encore::samples {

class TextCorpus {
 public:
  static constexpr int64_t kVocab = 96;  // '\n' and ' ' .. '~'
  static constexpr int64_t kIgnore = -100;  // F::cross_entropy's default ignore_index

  static int64_t encode(char c) { return c == '\n' ? 0 : static_cast<unsigned char>(c) - 31; }
  static char decode(int64_t id) { return id == 0 ? '\n' : static_cast<char>(id + 31); }

  // Every regular file in `dir` without an extension (fortunes ships NAME, NAME.dat, NAME.u8), in
  // name order. An empty corpus is an Error naming the directory.
  explicit TextCorpus(const std::string& dir, double held_out = 0.05) {
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    if (fs::is_directory(dir))
      for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) read_entries(f);
    ENCORE_CHECK(!entries_.empty(), "no text in ", dir,
                 fs::is_directory(dir) ? "" : " (not a directory)",
                 " (install it with: sudo apt-get install fortunes)");
    const auto split = static_cast<size_t>(static_cast<double>(entries_.size()) * (1 - held_out));
    for (size_t i = 0; i < entries_.size(); ++i) (i < split ? train_ : valid_) += entries_[i];
    for (size_t start = 0, end; start < train_.size(); start = end + 1) {
      end = train_.find('\n', start);
      if (end == std::string::npos) break;
      if (end - start >= 2) lines_.push_back(train_.substr(start, end - start + 1));
    }
    files_ = static_cast<int64_t>(files.size());
  }

  int64_t files() const { return files_; }
  int64_t entries() const { return static_cast<int64_t>(entries_.size()); }
  int64_t lines() const { return static_cast<int64_t>(lines_.size()); }
  const std::string& train_text() const { return train_; }
  const std::string& valid_text() const { return valid_; }

  // Throws unless `text` (`which` text, for the message) holds a window of `steps` + 1 symbols.
  static void check_window(const std::string& text, int64_t steps, const char* which) {
    ENCORE_CHECK(text.size() > static_cast<size_t>(steps), which, " text of ", text.size(),
                 " characters is shorter than a window of ", steps,
                 " + 1 (--seq): give a larger corpus (--data) or a smaller --seq");
  }

  // `batch` windows of `steps` + 1 symbols at random offsets of `text`: inputs [B,T] and their
  // next symbols [B,T] (int64).
  static std::pair<Tensor, Tensor> windows(const std::string& text, int64_t batch, int64_t steps,
                                           std::mt19937_64& rng) {
    check_window(text, steps, "a");
    Tensor x = empty({batch, steps}, DType::Int64), t = empty({batch, steps}, DType::Int64);
    int64_t* px = x.data<int64_t>();
    int64_t* pt = t.data<int64_t>();
    std::uniform_int_distribution<size_t> offset(0, text.size() - static_cast<size_t>(steps) - 1);
    for (int64_t b = 0; b < batch; ++b) {
      const size_t o = offset(rng);
      for (int64_t i = 0; i < steps; ++i) {
        px[b * steps + i] = encode(text[o + i]);
        pt[b * steps + i] = encode(text[o + i + 1]);
      }
    }
    return {x, t};
  }

  // `batch` lines of the training text (each with its '\n') from line `first` on (wrapping),
  // each cut to at most `max_steps` + 1 symbols, as one batch as long as its longest line rounded
  // up to a multiple of `bucket` (capped at max_steps): the positions past a line's end read
  // '\n' and are ignored by the loss. Varying lengths are varying signatures for a static step.
  std::pair<Tensor, Tensor> lines_batch(int64_t first, int64_t batch, int64_t max_steps,
                                        int64_t bucket) const {
    ENCORE_CHECK(lines() > 0,
                 "no training line of 2 or more characters: --lines has none to batch "
                 "(give a larger corpus, or drop --lines)");
    std::vector<const std::string*> rows;
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; ++b) {
      rows.push_back(&lines_[static_cast<size_t>((first + b) % lines())]);
      longest = std::max(longest, std::min(static_cast<int64_t>(rows.back()->size()) - 1,
                                           max_steps));
    }
    const int64_t steps = std::min(max_steps, (longest + bucket - 1) / bucket * bucket);
    Tensor x = zeros({batch, steps}, DType::Int64), t = full({batch, steps}, kIgnore, DType::Int64);
    int64_t* px = x.data<int64_t>();
    int64_t* pt = t.data<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      const std::string& s = *rows[static_cast<size_t>(b)];
      const int64_t n = std::min(static_cast<int64_t>(s.size()) - 1, steps);
      for (int64_t i = 0; i < n; ++i) {
        px[b * steps + i] = encode(s[static_cast<size_t>(i)]);
        pt[b * steps + i] = encode(s[static_cast<size_t>(i + 1)]);
      }
    }
    return {x, t};
  }

 private:
  void read_entries(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::string line, entry;
    auto flush = [&] {
      if (entry.size() > 1) entries_.push_back(entry);
      entry.clear();
    };
    while (std::getline(in, line)) {
      if (line == "%") {
        flush();
        continue;
      }
      for (char c : line) {
        if (c == '\t') c = ' ';
        if (c >= ' ' && c <= '~') entry += c;
      }
      entry += '\n';
    }
    flush();
  }

  std::vector<std::string> entries_, lines_;
  std::string train_, valid_;
  int64_t files_ = 0;
};

}  // namespace encore::samples
