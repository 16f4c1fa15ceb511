// The report's layout: a claim or a recommendation is one short row, and what stands behind
// it (the rule, the contrasts, the evidence; the alternatives, what was left out) sits in a
// disclosure under it; verdict badges carry class names a browser reads as one class; and
// claims.csv appends its new columns after the old ones, quoted as RFC 4180 says.
#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "gradscope/report/analysis.h"
#include "gradscope/report/csv.h"
#include "gradscope/report/html.h"
#include "gradscope/report/tables.h"
#include "test_util.h"

namespace gradscope {
namespace report_layout {

constexpr Verdict kEveryVerdict[] = {Verdict::kReproduced, Verdict::kNotReproduced,
                                     Verdict::kNotEnoughData, Verdict::kNotComparable,
                                     Verdict::kIndicativeOnly};

// Each piece of `html` that lies between `open` and the first `close` after it.
std::vector<std::string> spans(const std::string& html, const std::string& open,
                               const std::string& close) {
  std::vector<std::string> out;
  for (size_t at = html.find(open); at != std::string::npos; at = html.find(open, at + 1)) {
    const size_t end = html.find(close, at);
    out.push_back(html.substr(at, end == std::string::npos ? end : end + close.size() - at));
  }
  return out;
}

// Whether every occurrence of `needle` in `html` lies inside a <details> element.
bool only_in_details(const std::string& html, const std::string& needle) {
  for (size_t at = html.find(needle); at != std::string::npos; at = html.find(needle, at + 1)) {
    const size_t open = html.rfind("<details", at);
    const size_t closed = html.rfind("</details>", at);
    if (open == std::string::npos || (closed != std::string::npos && closed > open)) return false;
  }
  return true;
}

// The text a reader sees in a piece of HTML: the tags left out.
std::string visible_text(const std::string& html) {
  return std::regex_replace(html, std::regex("<[^>]*>"), "");
}

Finding finding_with_everything() {
  Finding f;
  f.id = "adam-not-best";
  f.claim = "Adam is not the best optimizer everywhere.";
  f.rule = "RULE-TEXT: each other optimizer's loss is tested against Adam's";
  f.verdict = Verdict::kIndicativeOnly;
  f.leaning = Verdict::kReproduced;
  f.verdict_equal_samples = Verdict::kNotEnoughData;
  f.verdict_equal_evaluations = Verdict::kNotReproduced;
  f.measured = "MEASURED-TEXT: in 12 cell(s) with Adam, 9 comparison(s) below it";
  f.headline = "SGD 2.07 vs Adam 2.21 on llama, p = 0.003";
  f.scale = "119 k parameters, 300 steps, rates from a grid";
  f.correction = "CORRECTION-TEXT: Bonferroni over 9 contrasts";
  f.contrasts = {"CONTRAST-ONE <b>sgd</b> vs adam: p = 0.003", "CONTRAST-TWO cg vs adam"};
  f.evidence = {{"EVIDENCE-TEXT llama tiny", "2.07 vs 2.21", "2.10 vs 2.21", "2.3 vs 2.21", ""}};
  f.notes = {"NOTE-TEXT: 1 comparison has fewer than 3 seeds"};
  return f;
}

TEST(ReportLayout, AClaimsRowHoldsNoRuleOutsideItsDisclosure) {
  const Finding f = finding_with_everything();
  const std::string html = claims_table_html({f});
  const std::vector<std::string> rows = spans(html, "<tr class=\"claim-row\"", "</tr>");
  ASSERT_EQ(rows.size(), 1u) << html;
  const std::string& row = rows.front();
  // The short row: the claim, the verdict, the headline and the scale, on one line.
  EXPECT_TRUE(testing::contains(row, f.claim)) << row;
  EXPECT_TRUE(testing::contains(row, "class=\"verdict v-indicative-only\"")) << row;
  EXPECT_TRUE(testing::contains(row, f.headline)) << row;
  EXPECT_TRUE(testing::contains(row, f.scale)) << row;
  EXPECT_EQ(row.find('\n'), std::string::npos) << row;
  // Everything else only inside the disclosure, which is closed until a click opens it.
  for (const char* behind : {"RULE-TEXT", "CORRECTION-TEXT", "CONTRAST-ONE", "CONTRAST-TWO",
                             "EVIDENCE-TEXT", "NOTE-TEXT", "MEASURED-TEXT"}) {
    EXPECT_FALSE(testing::contains(row, behind)) << behind;
    EXPECT_TRUE(testing::contains(html, behind)) << behind;
    EXPECT_TRUE(only_in_details(html, behind)) << behind;
  }
  EXPECT_FALSE(testing::contains(html, "<details open")) << html;
  // What the rule gave, behind the indicative verdict, and the verdicts at the fair bases.
  EXPECT_TRUE(testing::contains(html, "the rule gave: <span class=\"verdict v-reproduced\">"))
      << html;
  EXPECT_TRUE(only_in_details(html, "the rule gave"));
  EXPECT_TRUE(only_in_details(html, "class=\"verdict v-not-enough-data\""));
  // Text from the database stays text inside the disclosure too.
  EXPECT_FALSE(testing::contains(html, "<b>sgd</b>")) << html;
  EXPECT_TRUE(testing::contains(html, "CONTRAST-ONE &lt;b&gt;sgd&lt;/b&gt; vs adam")) << html;
}

TEST(ReportLayout, AClaimWithoutAHeadlineShowsWhatWasMeasured) {
  Finding f = finding_with_everything();
  f.headline.clear();
  f.verdict = Verdict::kReproduced;
  const std::string html = claims_table_html({f});
  const std::vector<std::string> rows = spans(html, "<tr class=\"claim-row\"", "</tr>");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(testing::contains(rows.front(), "MEASURED-TEXT")) << rows.front();
  // A verdict the runs can carry has no "the rule gave" line.
  EXPECT_FALSE(testing::contains(html, "the rule gave")) << html;
}

TEST(ReportLayout, AVerdictsClassNameHasNoSpace) {
  std::vector<std::string> seen;
  for (Verdict v : kEveryVerdict) {
    const std::string cls = verdict_class(v);
    SCOPED_TRACE(verdict_name(v));
    EXPECT_TRUE(std::regex_match(cls, std::regex("v-[a-z]+(-[a-z]+)*"))) << cls;
    EXPECT_EQ(std::find(seen.begin(), seen.end(), cls), seen.end()) << "shared: " << cls;
    seen.push_back(cls);
    Finding f = finding_with_everything();
    f.verdict = v;
    EXPECT_TRUE(testing::contains(claims_table_html({f}),
                                  "<span class=\"verdict " + cls + "\">" + verdict_name(v)));
  }
  // A verdict whose name has a space ("not enough data") is still one class.
  EXPECT_EQ(std::string(verdict_class(Verdict::kNotEnoughData)), "v-not-enough-data");
}

// A model with three configurations: the chosen one, one as good, one that does not fit, and
// notes on what was not ranked.
ReportData data_with_a_recommendation() {
  ReportData data;
  data.models = {"llama"};
  for (const char* label :
       {"sgd, standard", "adam, standard batch=16 lr=0.003 steps=300", "sgd, checkpoint"}) {
    Group g;
    g.model = "llama";
    g.preset = "tiny";
    g.label = label;
    data.groups.push_back(g);
  }
  Recommendation r;
  r.model = "llama";
  r.budget_bytes = 5.0 * 1024 * 1024;
  r.budget_source = "BUDGET-SOURCE the leanest run's peak";
  r.best = 0;
  r.best_loss = Interval{3.2782, 0.0216, 3};
  r.loss_kind = "validation";
  r.loss_notes = {"LOSS-NOTE not ranked, no validation loss by then: adam, accumulation k=2",
                  "LOSS-NOTE-TWO not ranked: sgd, accumulation k=2 (2 of 3 runs ok)"};
  r.loss_note = r.loss_notes[0] + "; " + r.loss_notes[1];
  r.not_worse = {2};
  r.equal_evaluations = 256;
  r.equal_samples = 256;
  r.time_to_point_s = 0.287;
  r.energy_to_point_j = 5.73;
  r.energy_known = true;
  r.fits = {0, 2};
  r.misses = {1};
  r.miss_reasons = {"MISS-REASON peak 16.94 MiB"};
  data.recommendations = {r};
  return data;
}

TEST(ReportLayout, ARecommendationsRowIsOneShortLine) {
  const ReportData data = data_with_a_recommendation();
  const std::string html = recommendations_table_html(data);
  const std::vector<std::string> rows = spans(html, "<tr class=\"rec-row\"", "</tr>");
  ASSERT_EQ(rows.size(), 1u) << html;
  const std::string& row = rows.front();
  EXPECT_EQ(row.find('\n'), std::string::npos) << row;
  const std::string text = visible_text(row);
  EXPECT_LE(text.size(), 160u) << text;
  // The pick, the number behind it and its scale.
  EXPECT_TRUE(testing::contains(text, "tiny: sgd, standard")) << text;
  EXPECT_TRUE(testing::contains(text, "validation 3.2782 ± 0.0216")) << text;
  EXPECT_TRUE(testing::contains(text, "at 256 gradient evaluations, 3 seeds")) << text;
  EXPECT_TRUE(testing::contains(text, "5.00 MiB")) << text;
  // The one as good is named; the rest only behind the disclosure.
  EXPECT_TRUE(testing::contains(text, "sgd, checkpoint")) << text;
  for (const char* behind : {"BUDGET-SOURCE", "LOSS-NOTE", "LOSS-NOTE-TWO", "MISS-REASON"}) {
    EXPECT_FALSE(testing::contains(row, behind)) << behind;
    EXPECT_TRUE(testing::contains(html, behind)) << behind;
    EXPECT_TRUE(only_in_details(html, behind)) << behind;
  }
  // The short parts hold no line break, whatever the notes hold.
  const RecommendationView v = recommendation_view(data, data.recommendations.front());
  for (const std::string& part : {v.budget, v.pick, v.loss, v.scale, v.alternatives})
    EXPECT_EQ(part.find('\n'), std::string::npos) << part;
}

TEST(ReportLayout, ARecommendationWithSeveralAsGoodCountsThemAndNamesThemBehind) {
  ReportData data = data_with_a_recommendation();
  data.recommendations.front().not_worse = {1, 2};
  const std::string html = recommendations_table_html(data);
  const std::string row = spans(html, "<tr class=\"rec-row\"", "</tr>").front();
  EXPECT_TRUE(testing::contains(row, "2 configurations")) << row;
  EXPECT_FALSE(testing::contains(row, "batch=16")) << row;
  EXPECT_TRUE(only_in_details(html, "adam, standard batch=16 lr=0.003 steps=300")) << html;
}

// The fields of one CSV line (RFC 4180: quoted fields, "" a quote inside one).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      out.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

TEST(ReportLayout, ClaimsCsvAppendsTheNewColumnsQuoted) {
  Finding f = finding_with_everything();
  f.headline = "SGD 2.07 vs \"Adam\" 2.21, p = 0.003";
  f.contrasts = {"sgd vs adam, llama: p = 0.003", "cg vs adam"};
  Finding plain = finding_with_everything();
  plain.id = "checkpoint-loss";
  plain.verdict = Verdict::kNotReproduced;
  plain.leaning = Verdict::kNotEnoughData;  // not read: the runs carry the verdict
  const std::string csv = claims_csv({f, plain});
  const std::string header = csv.substr(0, csv.find('\n'));
  // The old columns first, in their order, then the new ones.
  EXPECT_EQ(header,
            "claim_id,claim,verdict_equal_steps,verdict_equal_samples,verdict_equal_evaluations,"
            "measured,rule,headline,scale,correction,contrasts,verdict_rule_gave");
  EXPECT_TRUE(testing::contains(csv, ",\"SGD 2.07 vs \"\"Adam\"\" 2.21, p = 0.003\",")) << csv;
  const size_t first = csv.find('\n') + 1;
  const std::vector<std::string> row = csv_fields(csv.substr(first, csv.find('\n', first) - first));
  ASSERT_EQ(row.size(), 12u) << csv;
  EXPECT_EQ(row[0], "adam-not-best");
  EXPECT_EQ(row[2], "indicative only");
  EXPECT_EQ(row[6], f.rule);
  EXPECT_EQ(row[7], f.headline);
  EXPECT_EQ(row[8], f.scale);
  EXPECT_EQ(row[9], f.correction);
  EXPECT_EQ(row[10], "sgd vs adam, llama: p = 0.003 | cg vs adam");
  EXPECT_EQ(row[11], "reproduced");
  // A verdict the runs carry is what the rule gave.
  const size_t second = csv.find('\n', first) + 1;
  const std::vector<std::string> other =
      csv_fields(csv.substr(second, csv.find('\n', second) - second));
  ASSERT_EQ(other.size(), 12u) << csv;
  EXPECT_EQ(other[11], "not reproduced");
}

}  // namespace report_layout
}  // namespace gradscope
