// The source's offer state per region: probe, offer while offers fill, back off
// (re-probing now and then) where they do not; answers checked against what
// was offered.
#include "engine/session/content_offer.h"

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

std::vector<RegionInfo> Regions() {
  return {RegionInfo{1, "weights", 1024 * 4096, 4096, RegionHint::kStatic},
          RegionInfo{2, "kv", 1024 * 4096, 4096, RegionHint::kDynamic}};
}

wire::v1::ContentAnswer Answer(uint32_t region, uint64_t first, uint32_t pages, std::vector<uint32_t> missed) {
  wire::v1::ContentAnswer a;
  a.set_region(region);
  a.set_first_page(first);
  a.set_pages(pages);
  for (uint32_t m : missed) a.add_missed(m);
  return a;
}

TEST(ContentOffer, OffersNothingUntilTheDestinationSaysItHasAStore) {
  ContentOffer o(Regions());
  EXPECT_FALSE(o.ShouldOffer(0, 16));
  o.Enable();
  EXPECT_TRUE(o.ShouldOffer(0, 16));
}

TEST(ContentOffer, ProbesWithinAWindowThenOffersWhereOffersFill) {
  ContentOffer o(Regions(), /*probe_window_pages=*/64);
  o.Enable();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(o.ShouldOffer(0, 16)) << i;
    o.Offered(0, 16);
  }
  EXPECT_FALSE(o.ShouldOffer(0, 16)) << "64 pages wait for an answer: the rest is sent as bytes";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(o.Answer(Answer(1, 16 * i, 16, {})).ok());
  EXPECT_EQ(o.state(0), ContentOffer::State::kOffering);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(o.ShouldOffer(0, 16)) << "offering has no window";
    o.Offered(0, 16);
  }
  EXPECT_EQ(o.state(1), ContentOffer::State::kProbing) << "regions are judged apart";
}

TEST(ContentOffer, BacksOffWhereNothingFillsAndReprobesNowAndThen) {
  ContentOffer o(Regions(), /*probe_window_pages=*/64, /*reprobe_every=*/8);
  o.Enable();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(o.ShouldOffer(1, 16));
    o.Offered(1, 16);
  }
  std::vector<uint32_t> all(16);
  for (uint32_t k = 0; k < 16; ++k) all[k] = k;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(o.Answer(Answer(2, 16 * i, 16, all)).ok());
  EXPECT_EQ(o.state(1), ContentOffer::State::kOff);
  int offered = 0;
  for (int i = 0; i < 64; ++i) offered += o.ShouldOffer(1, 16) ? 1 : 0;
  EXPECT_EQ(offered, 8) << "one run in 8 re-probes";
  auto missed = o.TakeMissed();
  EXPECT_EQ(missed.size(), 64u);
  EXPECT_EQ(missed.front().region, 1u);
  EXPECT_EQ(missed.back().page, 63u);
  EXPECT_TRUE(o.TakeMissed().empty());
  EXPECT_EQ(o.missed_pages(), 64u);
}

TEST(ContentOffer, ComesBackToOfferingWhenALaterPartFills) {
  ContentOffer o(Regions(), 64, 1);
  o.Enable();
  std::vector<uint32_t> all(64);
  for (uint32_t k = 0; k < 64; ++k) all[k] = k;
  o.Offered(0, 64);
  ASSERT_TRUE(o.Answer(Answer(1, 0, 64, all)).ok());
  EXPECT_EQ(o.state(0), ContentOffer::State::kOff);
  for (int i = 0; i < 4; ++i) {
    o.Offered(0, 64);
    ASSERT_TRUE(o.Answer(Answer(1, 64 + 64 * i, 64, {})).ok());
  }
  EXPECT_EQ(o.state(0), ContentOffer::State::kOffering);
}

TEST(ContentOffer, AnAnswerForWhatWasNotOfferedIsAProtocolError) {
  ContentOffer o(Regions());
  o.Enable();
  o.Offered(0, 16);
  EXPECT_NE(o.Answer(Answer(9, 0, 16, {})).message().find("region 9 does not exist"), std::string::npos);
  EXPECT_NE(o.Answer(Answer(1, 1020, 16, {})).message().find("outside region weights"), std::string::npos);
  EXPECT_NE(o.Answer(Answer(1, 0, 16, {3, 2})).message().find("out of order"), std::string::npos);
  EXPECT_NE(o.Answer(Answer(1, 0, 16, {16})).message().find("outside the offer"), std::string::npos);
  EXPECT_NE(o.Answer(Answer(1, 0, 32, {})).message().find("32 pages of region weights answered, 16"), std::string::npos);
  EXPECT_TRUE(o.Answer(Answer(1, 0, 16, {})).ok());
}

}  // namespace
}  // namespace gpumigrate
