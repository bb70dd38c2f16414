#include "gpumigrate/common/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("half: odd input");
  return x / 2;
}

Result<int> Quarter(int x) {
  GM_ASSIGN_OR_RETURN(int h, Half(x));
  GM_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Corrupt("frame: decode failed: bad magic");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_EQ(s.ToString(), "CORRUPT: frame: decode failed: bad magic");
  EXPECT_EQ(s.WithContext("data stream 2").message(), "data stream 2: frame: decode failed: bad magic");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
}

// A caller acts on the system's reason, not on the message's words: the errno
// travels with the status, through WithContext and copies.
TEST(Status, KeepsTheErrnoItWasMadeFrom) {
  const Status s = Status::FromErrno(-ECONNREFUSED, "tcp: connect 127.0.0.1:1");
  EXPECT_EQ(s.error_number(), ECONNREFUSED);
  EXPECT_EQ(s.WithContext("session join").error_number(), ECONNREFUSED);
  Result<int> r = s;
  EXPECT_EQ(r.status().error_number(), ECONNREFUSED);
  EXPECT_EQ(Unavailable("connection refused").error_number(), 0) << "words are not an errno";
}

TEST(Status, FromErrnoAcceptsNegativeValuesAndMapsCodes) {
  Status s = Status::FromErrno(-ECONNRESET, "net: recv");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("net: recv"), std::string::npos);
  EXPECT_NE(s.message().find("errno 104"), std::string::npos);
  EXPECT_EQ(Status::FromErrno(ENOMEM, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Status::FromErrno(EINVAL, "x").code(), StatusCode::kInvalidArgument);
}

TEST(Result, PropagatesThroughMacros) {
  auto q = Quarter(8);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 2);
  auto bad = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "half: odd input");
}

}  // namespace
}  // namespace gpumigrate
