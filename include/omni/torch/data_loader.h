// Makes a LibTorch `torch::data` data loader resumable without replacing it.
// The short way (a RandomSampler, like torch::data::make_data_loader's
// default; the position is registered by the TrainState, see train_state.h):
//
//   omni::torch_ext::TrainState state;
//   auto loader = omni::torch_ext::MakeDataLoader(state, std::move(dataset),
//       torch::data::DataLoaderOptions().batch_size(32).workers(2));
//
// By hand, with any sampler: wrap it, keep the position handle, register it.
//
//   auto position = std::make_shared<omni::torch_ext::LoaderPosition>();
//   auto loader = torch::data::make_data_loader(
//       dataset, omni::torch_ext::ResumableSampler(RandomSampler(n), position),
//       torch::data::DataLoaderOptions().batch_size(32).workers(2));
//   state.AddLoader("loader", position);          // or, without a TrainState:
//   rt->Register("loader", position.get(), omni::StateScope::kPerReplica);
//   rt->OnCommit([&] { position->Consumed(); });  // one batch per step
//   rt->Start();                                  // restores the position
//   for (auto& batch : *loader) {                 // resumes mid-epoch
//     rt->BeginStep(); ... train ...; rt->EndStep();
//   }
//
// The position is the inner sampler's state at the start of the epoch (its
// shuffled order, serialized) and the samples the trainer consumed since;
// batches the loader prefetched but the trainer did not consume are not
// counted, so they are served again after a resume. A batch counts as
// consumed when its step commits (Consumed() from Runtime::OnCommit, before
// the step's checkpoint), so a redone step does not count twice. A resumed
// epoch loads the saved order instead of reshuffling, so the torch generator
// is not drawn from (a resumed run draws the same random numbers as one that
// never stopped, when the RNGs are restored too: TrainState registers them);
// a position saved at the very end of an epoch resumes with the next epoch,
// shuffled as it would have been.
//
// Thread safety: the loader calls the sampler from the thread that iterates
// it (LibTorch's DataLoader does), which must also call Consumed().
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "omni/state.h"
#include "omni/torch/export.h"

namespace omni::torch_ext {

class OMNI_TORCH_EXPORT LoaderPosition final : public omni::Stateful {
 public:
  // The trainer consumed the oldest batch the loader handed out (call once
  // per batch whose step committed).
  void Consumed();
  // Epochs started (0 before the first), and samples consumed in this one.
  int64_t epoch() const { return epoch_; }
  int64_t consumed_samples() const { return consumed_; }

  // Keys "epoch_start" (the inner sampler's archive) and "position" (JSON:
  // epoch, consumed samples). Load refuses a malformed position
  // (InvalidArgument naming the key) and takes effect at the loader's next
  // begin().
  absl::Status Save(omni::StateWriter& writer) const override;
  absl::Status Load(const omni::StateReader& reader) override;

  // For ResumableSampler.
  struct Restore {
    std::string epoch_start;
    int64_t epoch = 0;
    int64_t consumed = 0;
  };
  std::optional<Restore> TakeRestore() { return std::exchange(restore_, std::nullopt); }
  void StartEpoch(std::string epoch_start, int64_t epoch, int64_t consumed);
  void HandedOut(size_t samples) { handed_out_.push_back(samples); }

 private:
  std::string epoch_start_;
  int64_t epoch_ = 0;
  int64_t consumed_ = 0;
  std::deque<size_t> handed_out_;  // batches handed out, not yet consumed
  std::optional<Restore> restore_;
};

// A sampler that records its position in a LoaderPosition. `Inner` is any
// torch::data sampler whose save / load round-trips its state within an
// epoch (RandomSampler, SequentialSampler, DistributedRandomSampler...).
template <typename Inner>
class ResumableSampler final
    : public torch::data::samplers::Sampler<typename Inner::BatchRequestType> {
 public:
  using BatchRequestType = typename Inner::BatchRequestType;

  ResumableSampler(Inner inner, std::shared_ptr<LoaderPosition> position)
      : inner_(std::move(inner)), position_(std::move(position)) {}

  void reset(torch::optional<size_t> new_size = torch::nullopt) override {
    if (std::optional<LoaderPosition::Restore> r = position_->TakeRestore(); r.has_value()) {
      // The saved epoch's order, without reshuffling; skip what was consumed.
      std::istringstream in(r->epoch_start);
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      inner_.load(archive);
      for (int64_t skipped = 0; skipped < r->consumed;) {
        torch::optional<BatchRequestType> b =
            inner_.next(static_cast<size_t>(r->consumed - skipped));
        if (!b.has_value() || b->empty()) break;
        skipped += static_cast<int64_t>(b->size());
      }
      if (!Exhausted()) {
        position_->StartEpoch(std::move(r->epoch_start), r->epoch, r->consumed);
        return;
      }
      // Saved at the very end of epoch r->epoch: the next one starts here.
      position_->StartEpoch(std::move(r->epoch_start), r->epoch, r->consumed);
    }
    inner_.reset(new_size);
    torch::serialize::OutputArchive archive;
    inner_.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    position_->StartEpoch(out.str(), position_->epoch() + 1, 0);
  }

  torch::optional<BatchRequestType> next(size_t batch_size) override {
    torch::optional<BatchRequestType> b = inner_.next(batch_size);
    if (b.has_value()) position_->HandedOut(b->size());
    return b;
  }

  void save(torch::serialize::OutputArchive& archive) const override { inner_.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { inner_.load(archive); }

 private:
  // Whether the inner sampler has nothing left in this epoch; leaves its
  // state as it was (a peek, then the saved state back).
  bool Exhausted() {
    torch::serialize::OutputArchive saved;
    inner_.save(saved);
    std::ostringstream out;
    saved.save_to(out);
    const torch::optional<BatchRequestType> peek = inner_.next(1);
    if (!peek.has_value() || peek->empty()) return true;
    std::istringstream in(out.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    inner_.load(archive);
    return false;
  }

  Inner inner_;
  std::shared_ptr<LoaderPosition> position_;
};

}  // namespace omni::torch_ext
