// CharLstm and TinyGpt (encore/models.h).
#include "api/src/routine.h"
#include "encore/models.h"

namespace encore::models {

namespace {

void check_tokens(const char* model, const Tensor& tokens) {
  detail::check_defined(model, "tokens", tokens);
  ENCORE_CHECK(tokens.rank() == 2, model, ": tokens must be [B,T], it is ", tokens.shape());
}

}  // namespace

CharLstm::CharLstm(int64_t vocab, int64_t embed_dim, int64_t hidden, int64_t layers) {
  embed = register_module("embed", std::make_shared<nn::Embedding>(vocab, embed_dim));
  lstm = register_module("lstm", std::make_shared<nn::LSTM>(
                                     embed_dim, hidden,
                                     nn::LSTMOptions{.num_layers = layers, .batch_first = true}));
  head = register_module("head", std::make_shared<nn::Linear>(hidden, vocab));
}

Tensor CharLstm::forward(const Tensor& tokens) {
  return std::get<0>(forward(tokens, Tensor(), Tensor()));
}

std::tuple<Tensor, Tensor, Tensor> CharLstm::forward(const Tensor& tokens, const Tensor& h0,
                                                     const Tensor& c0) {
  check_tokens("CharLstm", tokens);
  auto [y, h, c] = (*lstm)((*embed)(tokens), h0, c0);
  return {(*head)(y), h, c};
}

std::string CharLstm::describe() const {
  return cat("CharLstm(", embed->describe(), ", ", lstm->describe(), ", ", head->describe(), ")");
}

TinyGpt::TinyGpt(int64_t vocab, int64_t context, int64_t width, int64_t heads,
                 int64_t num_blocks) {
  ENCORE_CHECK(num_blocks >= 1, "TinyGpt: needs at least one block, got ", num_blocks);
  token = register_module("token", std::make_shared<nn::Embedding>(vocab, width));
  position = register_module("position", std::make_shared<nn::Embedding>(context, width));
  for (int64_t b = 0; b < num_blocks; ++b)
    blocks.push_back(register_module(cat("block", b),
                                     std::make_shared<nn::TransformerBlock>(width, heads)));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{width}));
  head = register_module("head", std::make_shared<nn::Linear>(width, vocab));
}

Tensor TinyGpt::forward(const Tensor& tokens) {
  check_tokens("TinyGpt", tokens);
  const int64_t t = tokens.size(1);
  ENCORE_CHECK(t >= 1 && t <= context(), "TinyGpt: tokens [B,T] need 1 <= T <= context ",
               context(), ", they are ", tokens.shape());
  // The first T rows of the position table, broadcast over the batch.
  Tensor h = F::add((*token)(tokens), F::slice(position->weight, 0, 0, t));
  for (const auto& block : blocks) h = (*block)(h);
  return (*head)((*norm)(h));
}

std::string TinyGpt::describe() const {
  return cat("TinyGpt(vocab ", token->weight.size(0), ", context ", context(), ", width ",
             token->weight.size(1), ", ", blocks.size(), " x ", blocks[0]->describe(), ")");
}

}  // namespace encore::models
