// LinkWatch: the rate the link carries a pre-copy round at, while it does.
//
// The session samples FrameSender::Link() during a round. The rate of a window
// (kWindow) is the bytes delivered over its wall time; it counts as the link's
// own measure (LinkBound) only when the streams were busy (a frame waiting or
// being written) for at least kBusyFraction of it, so a source that is slow to
// produce (zero pages, known pages, slow reads) never looks like a slow link,
// or when every sample of the window found bytes waiting in the streams' own
// buffers for the link to take them (FrameSender::LinkSample::unsent): a socket
// buffer of megabytes keeps the sender's queue empty for tens of seconds on a
// collapsed link, while the link is all that sets the pace.
// The peak is the best rate seen in the session over any span of at least
// kPeakSpan, busy or not (the link carried at least that much): what the link
// did before, for messages. Windows never span a round boundary (the streams
// idle while the destination confirms a round) or a change of sender (a
// resumed connection counts from zero). One thread.
#pragma once

#include <chrono>
#include <deque>
#include <optional>

#include "engine/session/frame_sender.h"

namespace gpumigrate {

class LinkWatch {
 public:
  static constexpr std::chrono::seconds kWindow{2};
  static constexpr std::chrono::milliseconds kPeakSpan{500};
  static constexpr double kBusyFraction = 0.9;

  void RoundStarted(const FrameSender::LinkSample& s);
  void Sample(const FrameSender::LinkSample& s);

  // The last full window's rate (bytes/s), once the round has run a window long.
  std::optional<double> rate() const { return rate_; }
  bool busy() const { return busy_; }
  bool backlogged() const { return backlogged_; }
  double peak() const { return peak_; }
  // A full window, busy or backlogged throughout: rate() is what the link carries now.
  bool LinkBound() const { return rate_ && (busy_ || backlogged_); }

 private:
  std::deque<FrameSender::LinkSample> samples_;  // this round's, the oldest at or before a window ago
  std::optional<double> rate_;
  bool busy_ = false;
  bool backlogged_ = false;
  double peak_ = 0;
};

}  // namespace gpumigrate
