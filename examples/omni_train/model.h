// The omni_train model: a small convolutional image encoder whose output
// tokens are prepended to the text tokens of a small causal transformer
// decoder. Attention is written from Linear layers (no
// torch::nn::MultiheadAttention) so the model computes the same thing on
// LibTorch 1.13 and 2.x.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace omni_train {

struct ModelConfig {
  int64_t vocab = 64;
  int64_t text_len = 16;
  int64_t image_tokens = 4;  // a 16x16 image becomes a 2x2 grid of tokens
  int64_t d_model = 32;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t mlp_ratio = 4;
  double dropout = 0;  // after attention and after the MLP, in training mode
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t d_model, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, D] -> [B, T, D]

 private:
  int64_t heads_, head_dim_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class DecoderBlockImpl : public torch::nn::Module {
 public:
  DecoderBlockImpl(int64_t d_model, int64_t heads, int64_t mlp_ratio, double dropout = 0);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor Dropout(const torch::Tensor& x);
  double dropout_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(DecoderBlock);

// [B, 3, 16, 16] images -> [B, image_tokens, D] tokens.
class ImageEncoderImpl : public torch::nn::Module {
 public:
  explicit ImageEncoderImpl(int64_t d_model);
  torch::Tensor forward(const torch::Tensor& images);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear to_tokens_{nullptr};
};
TORCH_MODULE(ImageEncoder);

class MultimodalLmImpl : public torch::nn::Module {
 public:
  explicit MultimodalLmImpl(const ModelConfig& config);

  // Logits [B, T, vocab] for the sequence [image tokens (if `images` is
  // defined), embedded `text_in`].
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& text_in);

  // Next-token logits and targets for a batch of full captions `text`
  // [B, text_len]: with images, every text token is predicted (the first from
  // the last image token); without, tokens 1.. are predicted from the text
  // before them. Returns {logits [B, n, vocab], targets [B, n]}.
  std::pair<torch::Tensor, torch::Tensor> NextTokenLogits(const torch::Tensor& images,
                                                          const torch::Tensor& text);

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  ImageEncoder encoder_{nullptr};
  torch::nn::Embedding tok_emb_{nullptr};
  torch::Tensor pos_emb_;
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(MultimodalLm);

// Mean cross-entropy of `logits` [B, n, V] against `targets` [B, n].
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace omni_train
