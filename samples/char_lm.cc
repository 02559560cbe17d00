// A character language model on real English text: the fortune files of Debian's `fortunes`
// package. Trains a CharLstm (or with --model gpt a TinyGpt) to predict the next character,
// eager or with the whole training step static (--static), or both side by side from one seed
// (--compare), then prints a generated sample.
//
//   build/samples/char_lm --static                  # CharLstm, fixed windows of 35 characters
//   build/samples/char_lm --model gpt --compare     # TinyGpt, eager and static side by side
//   build/samples/char_lm --static --lines          # lines of text: the LSTM unrolled over each
//                                                   # length retraces it
//   build/samples/char_lm --static --lines --bucket 16
//   build/samples/char_lm --model gpt --static --lines  # one trace serves every length
//   build/samples/char_lm --compare --clip 1 --cosine   # clipped gradients, a cosine schedule:
//                                                   # still one trace
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "encore/encore.h"
#include "samples/common.h"
#include "samples/text_corpus.h"

using namespace encore;
using samples::Clock;
using samples::TextCorpus;

namespace {

struct Flags {
  std::string model = "lstm", data = "/usr/share/games/fortunes", prompt = "The ";
  int64_t steps = 300, batch = 32, seq = 0, log_every = 50, seed = 0, generate = 300, bucket = 1;
  int64_t threads = 0;
  double lr = 0, temperature = 0.8, clip = 0;
  bool static_step = false, compare = false, lines = false, cosine = false;

  bool gpt() const { return model == "gpt"; }
  // Characters per sequence: a window, or with --lines the longest line taken (fortunes' lines
  // are at most about 80 characters).
  int64_t time_steps() const { return seq > 0 ? seq : lines ? 128 : gpt() ? 64 : 35; }
};

// One model, its optimizer, its batches and its training step (eager or static).
class Trainer {
 public:
  Trainer(const Flags& f, bool static_step, const TextCorpus& corpus)
      : f_(f), corpus_(corpus), rng_(static_cast<uint64_t>(f.seed)) {
    manual_seed(static_cast<uint64_t>(f.seed));
    if (f.gpt()) {
      gpt_ = std::make_shared<models::TinyGpt>(TextCorpus::kVocab, f.time_steps());
      model_ = gpt_;
      opt_ = std::make_unique<optim::AdamW>(model_->parameters(),
                                            optim::AdamWOptions{.lr = f.lr > 0 ? f.lr : 1e-3});
    } else {
      lstm_ = std::make_shared<models::CharLstm>(TextCorpus::kVocab);
      model_ = lstm_;
      opt_ = std::make_unique<optim::Adam>(model_->parameters(),
                                           optim::AdamOptions{.lr = f.lr > 0 ? f.lr : 2e-3});
    }
    // Stepped after each training step: a host-side rate the static step's replays read.
    if (f.cosine) sched_ = std::make_unique<optim::CosineAnnealingLR>(*opt_, f.steps);
    auto step = [model = model_, opt = opt_.get(), clip = f.clip](const Tensor& x,
                                                                  const Tensor& t) {
      Tensor loss = F::cross_entropy((*model)(x), t);
      opt->zero_grad();
      loss.backward();
      if (clip > 0) nn::clip_grad_norm_(model->parameters(), clip);
      opt->step();
      return loss;
    };
    auto traced = static_graph(step, {.name = "train_step", .arg_names = {"x", "t"},
                                      .modules = {model_}});
    step_ = static_step ? std::function<Tensor(const Tensor&, const Tensor&)>(traced)
                        : std::function<Tensor(const Tensor&, const Tensor&)>(step);
    stats_ = [traced] { return traced.stats(); };
  }

  // The next training batch: fixed windows, or (--lines) lines of text.
  std::pair<Tensor, Tensor> next_batch() {
    if (!f_.lines)
      return TextCorpus::windows(corpus_.train_text(), f_.batch, f_.time_steps(), rng_);
    auto b = corpus_.lines_batch(next_line_, f_.batch, f_.time_steps(), f_.bucket);
    next_line_ += f_.batch;
    return b;
  }

  double step(const Tensor& x, const Tensor& t) {
    const double loss = step_(x, t).item<double>();
    if (sched_) sched_->step();
    return loss;
  }

  // The mean loss over 8 held-out batches of fixed windows (eval mode, no gradients).
  double validation_loss() {
    NoGradGuard no_grad;
    model_->eval();
    std::mt19937_64 rng(1234);
    double sum = 0;
    for (int i = 0; i < 8; ++i) {
      auto [x, t] = TextCorpus::windows(corpus_.valid_text(), f_.batch, f_.time_steps(), rng);
      sum += F::cross_entropy((*model_)(x), t).item<double>();
    }
    model_->train();
    return sum / 8;
  }

  // `n` characters after the prompt, each drawn from softmax(logits / temperature).
  std::string generate(int64_t n) {
    NoGradGuard no_grad;
    model_->eval();
    std::mt19937_64 rng(static_cast<uint64_t>(f_.seed) + 1);
    std::vector<int64_t> ids;
    for (char c : f_.prompt)
      if (c == '\n' || (c >= ' ' && c <= '~')) ids.push_back(TextCorpus::encode(c));
    if (ids.empty()) ids.push_back(TextCorpus::encode('\n'));
    std::string out;
    Tensor h, c, logits;
    size_t fed = 0;  // CharLstm: symbols already fed (its state holds them)
    for (int64_t i = 0; i < n; ++i) {
      if (lstm_) {
        for (; fed < ids.size(); ++fed) {
          const Tensor tok = tensor({static_cast<double>(ids[fed])}, {1, 1}, DType::Int64);
          std::tie(logits, h, c) = lstm_->forward(tok, h, c);
        }
      } else {
        const size_t start = ids.size() > static_cast<size_t>(gpt_->context())
                                 ? ids.size() - static_cast<size_t>(gpt_->context())
                                 : 0;
        std::vector<double> window(ids.begin() + static_cast<std::ptrdiff_t>(start), ids.end());
        logits = (*gpt_)(tensor(window, {1, static_cast<int64_t>(window.size())}, DType::Int64));
      }
      const auto row = F::slice(logits, 1, -1, logits.size(1)).to_vector<double>();
      std::vector<double> p(row.size());
      const double top = *std::max_element(row.begin(), row.end());
      for (size_t k = 0; k < row.size(); ++k) p[k] = std::exp((row[k] - top) / f_.temperature);
      const auto next = static_cast<int64_t>(std::discrete_distribution<size_t>(p.begin(),
                                                                                p.end())(rng));
      ids.push_back(next);
      out += TextCorpus::decode(next);
    }
    model_->train();
    return out;
  }

  StaticStats stats() const { return stats_(); }
  nn::Module& model() { return *model_; }

 private:
  const Flags& f_;
  const TextCorpus& corpus_;
  std::mt19937_64 rng_;
  int64_t next_line_ = 0;
  std::shared_ptr<models::CharLstm> lstm_;
  std::shared_ptr<models::TinyGpt> gpt_;
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<optim::Adam> opt_;
  std::unique_ptr<optim::LRScheduler> sched_;
  std::function<Tensor(const Tensor&, const Tensor&)> step_;
  std::function<StaticStats()> stats_;
};

// `bucket`: the batches' lengths were padded to multiples of it (--bucket).
void print_static_report(const StaticStats& st, int64_t bucket) {
  std::printf("\ntrain_step: %lld calls, %lld traces, %lld replays, %lld eager\n",
              static_cast<long long>(st.calls), static_cast<long long>(st.traces),
              static_cast<long long>(st.hits), static_cast<long long>(st.eager_calls));
  samples::print_entries(st);
  if (st.traces > 1) {
    std::printf("traces (the first and the latest):\n");
    for (const RetraceEvent& e : st.traces_history) std::printf("  %s\n", e.message.c_str());
  }
  for (const DynamicReport& d : st.dynamic)
    std::printf("dynamic: %s\n  %lld sizes planned without tracing, %lld calls served\n",
                d.signature.c_str(), static_cast<long long>(d.sizes_planned),
                static_cast<long long>(d.hits));
  if (st.traces > 1 && st.dynamic.empty()) {
    for (const std::string& why : st.static_dims) std::printf("static: %s\n", why.c_str());
    if (bucket > 1)
      std::printf(
          "each padded length (a multiple of --bucket %lld) is a signature of its own: a "
          "larger bucket leaves fewer\n",
          static_cast<long long>(bucket));
    else
      std::printf(
          "each batch length is a new signature: train on fixed windows (drop --lines), or pad "
          "lengths to a few buckets (--bucket 16), so that a handful of traces serve every "
          "batch\n");
  }
}

void train(const Flags& f, const TextCorpus& corpus) {
  Trainer tr(f, f.static_step, corpus);
  std::printf("model %s, step %s\n\n", tr.model().describe().c_str(),
              f.static_step ? "static (traced once per batch shape, then replayed)" : "eager");
  const samples::Progress progress(f.steps, "step");
  double loss_sum = 0;
  int64_t since = 0;
  auto last = Clock::now();
  for (int64_t i = 1; i <= f.steps; ++i) {
    auto [x, t] = tr.next_batch();
    loss_sum += tr.step(x, t);
    ++since;
    progress.update(1, i);
    if (i % f.log_every == 0 || i == f.steps) {
      progress.clear();
      std::printf("step %5lld | loss %.4f | %.1f ms/step\n", static_cast<long long>(i),
                  loss_sum / static_cast<double>(since),
                  1e3 * samples::seconds_since(last) / static_cast<double>(since));
      std::fflush(stdout);
      loss_sum = 0;
      since = 0;
      last = Clock::now();
    }
  }
  std::printf("\nvalidation loss %.4f (%.3f bits per character)\n", tr.validation_loss(),
              tr.validation_loss() / std::log(2.0));
  if (f.static_step) print_static_report(tr.stats(), f.bucket);
  std::printf("\nsample:\n%s%s\n", f.prompt.c_str(), tr.generate(f.generate).c_str());
}

// Eager and static from the same seed, a step each in turn, timed apart; the losses must agree
// bit for bit.
void compare(const Flags& f, const TextCorpus& corpus) {
  Trainer eager(f, false, corpus), traced(f, true, corpus);
  std::printf("model %s, eager and static step side by side from the same seed\n\n",
              eager.model().describe().c_str());
  double seconds[2] = {0, 0};
  bool same = true;
  const samples::Progress progress(f.steps, "step");
  for (int64_t i = 1; i <= f.steps; ++i) {
    double loss[2];
    for (int turn = 0; turn < 2; ++turn) {
      const int k = (turn + static_cast<int>(i)) % 2;
      Trainer& tr = k ? traced : eager;
      auto [x, t] = tr.next_batch();
      const auto start = Clock::now();
      loss[k] = tr.step(x, t);
      seconds[k] += samples::seconds_since(start);
    }
    same = same && loss[0] == loss[1];
    progress.update(1, i);
    if (i % f.log_every == 0 || i == f.steps) {
      progress.clear();
      std::printf("step %5lld | loss eager %.6f static %.6f\n", static_cast<long long>(i),
                  loss[0], loss[1]);
    }
  }
  const double n = static_cast<double>(f.steps);
  std::printf("\neager  %.2f ms/step\nstatic %.2f ms/step\nspeedup %.2fx (eager time / static "
              "time, the first steps' traces included)\n",
              1e3 * seconds[0] / n, 1e3 * seconds[1] / n, seconds[0] / seconds[1]);
  std::printf("losses %s\n", same ? "identical (bit for bit)" : "DIFFER");
  print_static_report(traced.stats(), f.bucket);
  const double valid[2] = {eager.validation_loss(), traced.validation_loss()};
  std::printf("\nvalidation loss eager %.4f static %.4f (%s)\n", valid[0], valid[1],
              valid[0] == valid[1] ? "identical" : "DIFFER");
  std::printf("\nsample (static model):\n%s%s\n", f.prompt.c_str(),
              traced.generate(f.generate).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  samples::Cli cli("char_lm",
                   "Trains a character language model (CharLstm, or TinyGpt with --model gpt) on "
                   "the fortune files of Debian's fortunes package and prints a sample.");
  cli.text("model", &f.model, "lstm (CharLstm: embedding 64, LSTM 256) or gpt (TinyGpt: 2 "
                              "blocks, width 128, 4 heads)");
  cli.text("data", &f.data, "directory of fortune files (plain text, entries split by '%' lines)");
  cli.integer("steps", &f.steps, 1, "training steps");
  cli.integer("batch", &f.batch, 1, "sequences per batch");
  cli.integer("seq", &f.seq, 0,
              "characters per sequence (0: 35 for lstm, 64 for gpt; with --lines at most 128)");
  cli.number("lr", &f.lr, 0, "learning rate (0: 2e-3 Adam for lstm, 1e-3 AdamW for gpt)");
  cli.number("clip", &f.clip, 0,
             "clip the gradients' 2-norm to this at every step (0: no clipping)");
  cli.flag("cosine", &f.cosine, "anneal the learning rate to 0 over the steps (a cosine)");
  cli.flag("static", &f.static_step, "run the whole training step as a static graph");
  cli.flag("compare", &f.compare,
           "train eager and static side by side from the same seed and compare them");
  cli.flag("lines", &f.lines,
           "batch real lines of text, of varying length (padded to the longest, the padding "
           "ignored by the loss), instead of fixed windows");
  cli.integer("bucket", &f.bucket, 1, "with --lines: pad each batch's length to a multiple");
  cli.integer("log-every", &f.log_every, 1, "print the mean loss every N steps");
  cli.integer("generate", &f.generate, 0, "characters to generate at the end");
  cli.number("temperature", &f.temperature, 1e-3, "sampling temperature");
  cli.text("prompt", &f.prompt, "text the sample starts from");
  cli.integer("seed", &f.seed, 0, "seed for initialisation, batches and sampling");
  cli.integer("threads", &f.threads, 0, "threads for the kernels (0: the default)");
  cli.parse(argc, argv);
  if (f.model != "lstm" && f.model != "gpt") cli.die("--model is lstm or gpt, got " + f.model);
  if (f.bucket > 1 && !f.lines)
    cli.die("--bucket pads the lengths of --lines batches: give --lines");
  if (f.compare && f.static_step) cli.die("--compare trains both ways: drop --static");
  try {
    if (f.threads > 0) set_num_threads(static_cast<int>(f.threads));
    const TextCorpus corpus(f.data);
    std::printf("corpus %s: %lld files, %lld entries, %lld lines, %zu training and %zu held-out "
                "characters\n",
                f.data.c_str(), static_cast<long long>(corpus.files()),
                static_cast<long long>(corpus.entries()), static_cast<long long>(corpus.lines()),
                corpus.train_text().size(), corpus.valid_text().size());
    // Checked before training: the held-out windows are drawn only at its end.
    if (f.lines)
      ENCORE_CHECK(corpus.lines() > 0,
                   "no training line of 2 or more characters: --lines has "
                   "none to batch (give a larger corpus, or drop --lines)");
    else
      TextCorpus::check_window(corpus.train_text(), f.time_steps(), "the training");
    TextCorpus::check_window(corpus.valid_text(), f.time_steps(), "the held-out");
    if (f.compare)
      compare(f, corpus);
    else
      train(f, corpus);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "char_lm: %s\n", e.what());
    return 1;
  }
  return 0;
}
