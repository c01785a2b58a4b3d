// Uses the installed omni::torch: the parameter digest of a small module.
#include <cstdio>

#include "omni/hash.h"
#include "omni/torch/params.h"

int main() {
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 3);
  auto d = omni::torch_ext::ParamsXxh3(*lin);
  if (!d.ok()) return 1;
  std::printf("consumer torch ok: params_xxh3=%s\n", omni::HexDigest(*d).c_str());
  return 0;
}
