// The job-level manifest (private): its types, JSON text and parser, the
// parts' descriptions that replicas hand to rank 0, and the plan that spreads
// the replicated bytes over the replicas. See include/omni/job_checkpoint.h
// for the format.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/manifest_fields.h"
#include "ckpt/safetensors.h"
#include "omni/checkpoint.h"
#include "omni/state.h"

namespace omni::ckpt {

constexpr int kJobVersion = 2;
constexpr const char* kJobLayout = "job";

// "part-00003.safetensors" / "part-00003.json".
std::string PartFileName(int rank);
std::string PartFragmentName(int rank);

// A slice of a replicated tensor stored in one part.
struct JobPiece {
  int part = 0;
  uint64_t begin = 0;  // byte range within the tensor
  uint64_t end = 0;
  uint64_t data_begin = 0;  // in the part's data section
  uint64_t data_end = 0;
  uint64_t xxh3 = 0;
};

struct JobTensor {
  std::string key;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::vector<JobPiece> pieces;  // tiling [0, nbytes) in order
};

// The shape a piece is stored with in its part: the tensor's own when the
// piece is the whole tensor, else 1-D.
std::vector<int64_t> PieceShape(const JobTensor& t, const JobPiece& p);

struct JobPart {
  int rank = 0;
  std::string replica_id;
  std::string file;
  uint64_t bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t header_xxh3 = 0;
  uint64_t xxh3 = 0;
  uint64_t replicated_bytes = 0;
  uint64_t replica_bytes = 0;
};

// The fields shared with the per-rank layout (step, world_size,
// library_version, job_id, created_unix_ms, metadata) come from
// ManifestFields.
struct JobManifest : ManifestFields {
  std::string dir;  // the step directory
  int version = kJobVersion;
  uint64_t token = 0;
  std::vector<JobPart> parts;
  std::vector<JobTensor> replicated;                  // sorted by key
  std::vector<std::vector<TensorEntry>> per_replica;  // per part

  // Part `p`'s entries as its file holds them (pieces under their tensor's
  // key, then per-replica tensors), sorted by offset, with checksums.
  std::vector<TensorEntry> PartEntries(int p) const;
  int64_t TotalBytes() const;
  CheckpointInfo Info() const;
};

std::string JobManifestJson(const JobManifest& m);
// DataLoss naming the manifest (and key) for anything malformed;
// FailedPrecondition for a newer version or a manifest of another layout.
absl::StatusOr<JobManifest> ParseJobManifest(const std::string& text, const std::string& step_dir);
// Whether a manifest's text declares layout "job" (a cheap look).
bool DeclaresJobLayout(const std::string& text);

// ---- the plan

// A replicated tensor as listed before a save.
struct PlanItem {
  std::string key;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};
// Digest of the listing (keys, dtypes, shapes in order): replicas whose
// replicated state differs in structure have different digests.
uint64_t PlanDigest(const std::vector<PlanItem>& items);
// The `size` + 1 cut points in the concatenation of the items' bytes:
// rank r writes [cuts[r], cuts[r+1]). A cut falls on an element boundary of
// the tensor it cuts.
std::vector<uint64_t> PlanCuts(const std::vector<PlanItem>& items, int size);

// ---- what a replica hands to rank 0 (part-<rank>.json)

struct JobFragment {
  int64_t step = 0;
  uint64_t token = 0;
  int size = 0;
  uint64_t plan_digest = 0;
  JobPart part;
  std::map<std::string, JobPiece> pieces;  // by key (part = the rank)
  std::vector<TensorEntry> per_replica;
};
std::string JobFragmentJson(const JobFragment& f);
absl::StatusOr<JobFragment> ParseJobFragment(const std::string& text, const std::string& path);

}  // namespace omni::ckpt
