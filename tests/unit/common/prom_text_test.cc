// The Prometheus text format as written: families, escaping, values, and names
// the format does not allow dropped (and counted), never written.
#include "gpumigrate/common/prom_text.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

TEST(PromText, WritesFamiliesWithHelpTypeAndEscapedLabels) {
  PromText p;
  p.Family("gm_bytes_total", "counter", "Bytes sent\\nover the link\nhere");
  p.Sample("gm_bytes_total", {{"vm", "llm-1"}, {"why", "a \"quoted\" \\ path\nnext"}}, 1234);
  p.Sample("gm_bytes_total", {}, 0.5);
  EXPECT_EQ(p.text(),
            "# HELP gm_bytes_total Bytes sent\\\\nover the link\\nhere\n"
            "# TYPE gm_bytes_total counter\n"
            "gm_bytes_total{vm=\"llm-1\",why=\"a \\\"quoted\\\" \\\\ path\\nnext\"} 1234\n"
            "gm_bytes_total 0.5\n");
  EXPECT_EQ(p.dropped(), 0);
}

TEST(PromText, FormatsValuesAsTheFormatSpellsThem) {
  EXPECT_EQ(PromText::FormatValue(0), "0");
  EXPECT_EQ(PromText::FormatValue(60e9), "60000000000");
  EXPECT_EQ(PromText::FormatValue(-3), "-3");
  EXPECT_EQ(PromText::FormatValue(0.125), "0.125");
  EXPECT_EQ(PromText::FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(PromText::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PromText::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(PromText::FormatValue(1e300), "1e+300");
}

TEST(PromText, DropsWhatTheGrammarForbids) {
  EXPECT_TRUE(PromText::ValidName("gpumigrate_host_vms"));
  EXPECT_TRUE(PromText::ValidName("a:b_c9"));
  EXPECT_FALSE(PromText::ValidName("9lives"));
  EXPECT_FALSE(PromText::ValidName("has-dash"));
  EXPECT_FALSE(PromText::ValidName(""));
  EXPECT_TRUE(PromText::ValidLabelName("vm"));
  EXPECT_FALSE(PromText::ValidLabelName("__name__"));
  EXPECT_FALSE(PromText::ValidLabelName("a:b"));
  PromText p;
  p.Family("bad-name", "gauge", "x");
  p.Sample("bad-name", {}, 1);  // no family open: dropped too
  p.Family("ok", "histogramish", "x");
  p.Family("ok", "gauge", "fine");
  p.Sample("other", {}, 1);  // not of the family
  p.Sample("ok", {{"bad-label", "v"}}, 1);
  p.Sample("ok", {{"vm", "a"}}, 1);
  EXPECT_EQ(p.dropped(), 5);
  EXPECT_EQ(p.text(), "# HELP ok fine\n# TYPE ok gauge\nok{vm=\"a\"} 1\n");
}

}  // namespace
}  // namespace gpumigrate
