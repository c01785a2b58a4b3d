#include "model.h"

#include <cmath>
#include <limits>
#include <utility>

namespace omni_train {

namespace nn = torch::nn;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t d_model, int64_t heads)
    : heads_(heads), head_dim_(d_model / heads) {
  TORCH_CHECK(d_model % heads == 0, "d_model ", d_model, " is not a multiple of heads ", heads);
  qkv_ = register_module("qkv", nn::Linear(d_model, 3 * d_model));
  proj_ = register_module("proj", nn::Linear(d_model, d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  // [B, T, 3, H, hd] -> [3, B, H, T, hd]
  const torch::Tensor qkv =
      qkv_->forward(x).view({b, t, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
  const torch::Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
  torch::Tensor att =
      torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
  const torch::Tensor future =
      torch::ones({t, t}, x.options()).triu(/*diagonal=*/1).to(torch::kBool);
  att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  const torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, d});
  return proj_->forward(y);
}

DecoderBlockImpl::DecoderBlockImpl(int64_t d_model, int64_t heads, int64_t mlp_ratio,
                                   double dropout)
    : dropout_(dropout) {
  ln1_ = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d_model})));
  attn_ = register_module("attn", CausalSelfAttention(d_model, heads));
  ln2_ = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d_model})));
  fc1_ = register_module("fc1", nn::Linear(d_model, mlp_ratio * d_model));
  fc2_ = register_module("fc2", nn::Linear(mlp_ratio * d_model, d_model));
}

// No call at all without dropout, so that no generator is drawn from.
torch::Tensor DecoderBlockImpl::Dropout(const torch::Tensor& x) {
  return dropout_ > 0 && is_training() ? torch::dropout(x, dropout_, /*train=*/true) : x;
}

torch::Tensor DecoderBlockImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x + Dropout(attn_->forward(ln1_->forward(x)));
  return h + Dropout(fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(h)))));
}

ImageEncoderImpl::ImageEncoderImpl(int64_t d_model) {
  // 3x16x16 -> 16x8x8 -> 32x4x4 -> (2x2 average pool) 32x2x2 -> 4 tokens.
  conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(2).padding(1)));
  conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)));
  to_tokens_ = register_module("to_tokens", nn::Linear(32, d_model));
}

torch::Tensor ImageEncoderImpl::forward(const torch::Tensor& images) {
  torch::Tensor h = torch::relu(conv1_->forward(images));
  h = torch::relu(conv2_->forward(h));
  h = torch::avg_pool2d(h, {2, 2});                // [B, 32, 2, 2]
  h = h.flatten(/*start_dim=*/2).transpose(1, 2);  // [B, 4, 32]
  return to_tokens_->forward(h);                   // [B, 4, D]
}

MultimodalLmImpl::MultimodalLmImpl(const ModelConfig& config) : config_(config) {
  encoder_ = register_module("encoder", ImageEncoder(config.d_model));
  tok_emb_ = register_module("tok_emb", nn::Embedding(config.vocab, config.d_model));
  pos_emb_ = register_parameter(
      "pos_emb", torch::randn({config.image_tokens + config.text_len, config.d_model}) * 0.02);
  blocks_ = register_module("blocks", nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) {
    blocks_->push_back(
        DecoderBlock(config.d_model, config.heads, config.mlp_ratio, config.dropout));
  }
  ln_f_ = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({config.d_model})));
  head_ = register_module("head", nn::Linear(config.d_model, config.vocab));
}

torch::Tensor MultimodalLmImpl::forward(const torch::Tensor& images, const torch::Tensor& text_in) {
  torch::Tensor x = tok_emb_->forward(text_in);  // [B, L, D]
  if (images.defined()) x = torch::cat({encoder_->forward(images), x}, /*dim=*/1);
  TORCH_CHECK(x.size(1) <= pos_emb_.size(0), "sequence of ", x.size(1), " tokens is too long");
  x = x + pos_emb_.narrow(0, 0, x.size(1));
  for (const auto& block : *blocks_) x = block->as<DecoderBlock>()->forward(x);
  return head_->forward(ln_f_->forward(x));
}

std::pair<torch::Tensor, torch::Tensor> MultimodalLmImpl::NextTokenLogits(
    const torch::Tensor& images, const torch::Tensor& text) {
  const int64_t len = text.size(1);
  const torch::Tensor text_in = text.narrow(1, 0, len - 1);
  const torch::Tensor logits = forward(images, text_in);
  if (images.defined()) {
    const int64_t prefix = logits.size(1) - (len - 1);  // image tokens
    return {logits.narrow(1, prefix - 1, len), text};
  }
  return {logits, text.narrow(1, 1, len - 1)};
}

torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t vocab = logits.size(-1);
  return torch::nll_loss(torch::log_softmax(logits.reshape({-1, vocab}), -1),
                         targets.reshape({-1}));
}

}  // namespace omni_train
