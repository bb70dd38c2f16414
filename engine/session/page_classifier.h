// Zero-page elision for the sender: splits a chunk read from a region into runs
// of zero pages (sent as kZeroPages frames with no payload, or not at all in
// round 0, where a fresh destination already holds zeros) and runs of data pages
// (sent through the region's codec), and hashes every page for the Prepare
// digests (page_hashes.h). Zero pages are found with the codec layer's
// IsZeroPage, the same test the codec sample uses.
//
// One classifier per sending thread; its results stay valid until the next
// Classify. Pure: no I/O.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gpumigrate {

struct PageRun {
  uint64_t first_page = 0;    // index of the run's first page within the chunk
  uint64_t pages = 0;
  uint64_t offset_bytes = 0;  // within the chunk
  uint64_t length_bytes = 0;  // short when the run ends with the chunk's short last page
  bool zero = false;
};

// The parts of `run` (pages of a classified chunk) whose hash differs from what
// the destination already holds, appended to `out` in order. `hashes[k]` and
// `held[k]` are chunk page k's new hash and the destination's; returns how many
// of the run's pages were equal (and so need not be sent).
uint64_t AppendUnknownParts(const PageRun& run, std::span<const uint64_t> hashes, std::span<const uint64_t> held,
                            uint64_t page_size, std::vector<PageRun>& out);

class PageClassifier {
 public:
  // `chunk` is whole pages of `page_size` bytes, the last possibly short.
  // Afterwards runs() covers it exactly, in order, alternating zero and data,
  // and hashes()[k] is HashPage of page k.
  void Classify(std::span<const std::byte> chunk, uint64_t page_size);
  const std::vector<PageRun>& runs() const { return runs_; }
  const std::vector<uint64_t>& hashes() const { return hashes_; }

 private:
  std::vector<PageRun> runs_;
  std::vector<uint64_t> hashes_;
  // The hash of a zero page of the last length seen: full pages share one value.
  uint64_t zero_len_ = UINT64_MAX, zero_hash_ = 0;
};

}  // namespace gpumigrate
