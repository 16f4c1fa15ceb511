// The report of runs with several ranks, on records built here whose figures are known: each
// rank's memory beside the same configuration in one process, step time and scaling efficiency
// against the number of ranks, the new CSV columns, the phases and memory figures' new parts,
// the end-of-run summary, and a shard name from a record that stays text.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "gradscope/report/analysis.h"
#include "gradscope/report/render.h"
#include "gradscope/report/scaling.h"
#include "gradscope/report/summary.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

constexpr double kDistMiB = 1024.0 * 1024.0;

bool dist_gnuplot_installed() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// One rank's breakdown at its peak, in MiB: params, grads, optimizer state, buffers,
// activations, other.
MemoryBreakdown dist_breakdown(double params, double grads, double state, double buffers,
                               double activations, double other) {
  const auto b = [](double mib) { return static_cast<int64_t>(mib * kDistMiB); };
  MemoryBreakdown m;
  m.params = b(params);
  m.grads = b(grads);
  m.optimizer_state = b(state);
  if (buffers > 0) m.collective_buffers = b(buffers);
  m.activations = b(activations);
  m.other = b(other);
  return m;
}

int64_t dist_sum(const MemoryBreakdown& m) {
  return m.params + m.frozen_params + m.grads.value_or(0) + m.optimizer_state +
         m.collective_buffers.value_or(0) + m.activations.value_or(0) + m.other;
}

// A run of the tiny Llama (per-rank batch 4, 10 timed steps) on `nproc` ranks with `shard`,
// at `tokens_per_s` (every rank's tokens) and `step_s` per step. Rank k of a sharded run holds
// its shard of the optimizer state (8 MiB over the ranks) and of the gradients (zero2), and
// 1 MiB of buffers; with several ranks, each waits 20 ms per step on collectives and sends
// (k + 1) MiB per step, and (60 + 10k)% of its gradients are reduced during backward.
RunRecord dist_run(int64_t nproc, Shard shard, double tokens_per_s, double step_s,
                   uint64_t seed = 0) {
  RunRecord r;
  r.config.model = "llama";
  r.config.preset = "tiny";
  r.config.optimizer = "adam";
  r.config.lr = 1e-3;
  r.config.batch = 4;
  r.config.seq_len = 16;
  r.config.steps = 10;
  r.config.seed = seed;
  r.config.nproc = nproc;
  r.config.shard = shard;
  r.run_id = fmt::format("llama-{}-{}-{}", shard_name(shard), nproc, seed);
  r.attempt_uid = r.run_id;
  r.started_at = "2026-01-01T00:00:00Z";
  r.finished_at = "2026-01-01T00:00:01Z";
  r.status = RunStatus::kOk;
  for (int64_t s = 1; s <= 10; ++s)
    r.steps.push_back(StepEntry{s, 3.0 - 0.1 * static_cast<double>(s), 1e-3, 1.0, step_s, 4 * nproc,
                                64 * nproc, 64 * nproc, 1, false});
  r.final_loss = 2.0;
  RunTime t;
  t.timed_steps = 10;
  t.step_median_s = step_s;
  t.total_s = 10 * step_s;
  t.data_s = 0.1 * step_s;
  t.forward_s = 3 * step_s;
  t.backward_s = 5 * step_s;
  t.optimizer_s = 1 * step_s;
  const bool sharded = shard != Shard::kNone;
  if (sharded) t.comm_s = 0.2;  // 20 ms per timed step
  r.time = t;
  RunThroughput put;
  put.tokens_per_s = tokens_per_s;
  put.samples_per_s = tokens_per_s / 16;
  r.throughput = put;
  const double ranks = static_cast<double>(nproc);
  const bool state_split = shard == Shard::kZero1 || shard == Shard::kZero2;
  const double state = state_split ? 8 / ranks : 8;
  const double grads = shard == Shard::kZero2 ? 4 / ranks : 4;
  const auto rank_breakdown = [&](int64_t k) {
    return dist_breakdown(4, grads, state, sharded ? 1 : 0, 10 + static_cast<double>(k), 1);
  };
  RunMemory m;
  m.breakdown = rank_breakdown(0);
  m.peak_bytes = dist_sum(m.breakdown);
  m.params_bytes = static_cast<int64_t>(4 * kDistMiB);
  m.grads_bytes = static_cast<int64_t>(grads * kDistMiB);
  m.optimizer_state_bytes = static_cast<int64_t>(state * kDistMiB);
  r.memory = m;
  if (sharded) {
    RunDistributed d;
    d.world = nproc;
    d.shard = shard_name(shard);
    d.launcher = "gradscope";
    d.backend = nproc > 1 ? "gloo" : "none";
    d.flat_params = 1000000;
    d.shard_params = state_split ? 1000000 / nproc : 1000000;
    for (int64_t k = 0; k < nproc; ++k) {
      RankFigures f;
      f.rank = k;
      f.breakdown = rank_breakdown(k);
      f.peak_bytes = dist_sum(f.breakdown);
      f.peak_phase = "backward";
      f.params_bytes = m.params_bytes;
      f.grads_bytes = m.grads_bytes;
      f.optimizer_state_bytes = m.optimizer_state_bytes;
      f.collective_buffer_peak_bytes = static_cast<int64_t>(kDistMiB);
      f.step_median_s = step_s;
      f.comm_s = 0.2;
      f.backward_s = 5 * step_s;
      if (nproc > 1) {
        f.bytes_sent_per_step = static_cast<double>(k + 1) * kDistMiB;
        f.overlapped_share = 0.6 + 0.1 * static_cast<double>(k);
      }
      d.ranks.push_back(f);
    }
    r.distributed = d;
  }
  return r;
}

// One process, ddp on one rank, ddp on 2, zero2 on 2 and on 4.
std::vector<RunRecord> dist_runs(bool ddp_on_one = true) {
  std::vector<RunRecord> runs = {dist_run(1, Shard::kNone, 1000, 0.10)};
  if (ddp_on_one) runs.push_back(dist_run(1, Shard::kDdp, 900, 0.11));
  runs.push_back(dist_run(2, Shard::kDdp, 1620, 0.12));
  runs.push_back(dist_run(2, Shard::kZero2, 1440, 0.13));
  runs.push_back(dist_run(4, Shard::kZero2, 2520, 0.15));
  return runs;
}

size_t dist_group(const ReportData& d, int64_t nproc, Shard shard) {
  for (size_t i = 0; i < d.groups.size(); ++i)
    if (d.groups[i].config.nproc == nproc && d.groups[i].config.shard == shard) return i;
  ADD_FAILURE() << "no group " << shard_name(shard) << " x" << nproc;
  return 0;
}

// The lines of a text that start with `prefix`.
std::vector<std::string> dist_lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

// A CSV's column of one row by the header's name (no quoted commas before it).
std::string dist_csv_cell(const std::string& csv, const std::string& run_id,
                          const std::string& column) {
  std::istringstream in(csv);
  std::string header;
  std::getline(in, header);
  const auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) {
        cells.push_back(cell);
        cell.clear();
      } else {
        cell += c;
      }
    }
    cells.push_back(cell);
    return cells;
  };
  const std::vector<std::string> names = split(header);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> cells = split(line);
    if (cells.empty() || cells[0] != run_id) continue;
    for (size_t i = 0; i < names.size() && i < cells.size(); ++i)
      if (names[i] == column) return cells[i];
  }
  ADD_FAILURE() << "no cell " << column << " of " << run_id;
  return "";
}

TEST(DistributedReport, ScalingEfficiencyAgainstDdpOnOneRankElseOneProcess) {
  const ReportData d = analyze_records(dist_runs(), {});
  const size_t none1 = dist_group(d, 1, Shard::kNone),
               ddp1 = dist_group(d, 1, Shard::kDdp);
  const size_t ddp2 = dist_group(d, 2, Shard::kDdp),
               zero2 = dist_group(d, 2, Shard::kZero2);
  const size_t zero4 = dist_group(d, 4, Shard::kZero2);
  EXPECT_EQ(scaling_baseline(d, ddp2), ddp1);
  EXPECT_EQ(scaling_baseline(d, zero4), ddp1);
  EXPECT_EQ(one_process_group(d, zero2), none1);
  EXPECT_NEAR(scaling_efficiency(d, ddp2), 1620 / (2 * 900.0), 1e-12);
  EXPECT_NEAR(scaling_efficiency(d, zero2), 1440 / (2 * 900.0), 1e-12);
  EXPECT_NEAR(scaling_efficiency(d, zero4), 2520 / (4 * 900.0), 1e-12);
  EXPECT_NEAR(scaling_efficiency(d, ddp1), 1.0, 1e-12);
  // Lines: one process, ddp (1 and 2 ranks), zero2 (2 and 4).
  const std::vector<ScalingLine> lines = scaling_lines(d, "llama");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].title, "1 process");
  EXPECT_EQ(lines[1].title, "ddp");
  EXPECT_EQ(lines[1].groups, (std::vector<size_t>{ddp1, ddp2}));
  EXPECT_EQ(lines[2].title, "zero2");
  EXPECT_EQ(lines[2].groups, (std::vector<size_t>{zero2, zero4}));
  EXPECT_EQ(rank_counts(d, lines), 3u);
  // The table (Markdown and HTML both come from it) prints the efficiency.
  const Table t = ranks_table(d, "llama");
  ASSERT_EQ(t.rows.size(), 5u);
  const auto column = [&](const std::string& name) {
    return std::find(t.header.begin(), t.header.end(), name) - t.header.begin();
  };
  const auto efficiency = column("scaling efficiency");
  EXPECT_EQ(t.rows[2][efficiency], "90%");  // ddp x2
  EXPECT_EQ(t.rows[3][efficiency], "80%");  // zero2 x2
  EXPECT_EQ(t.rows[4][efficiency], "70%");  // zero2 x4
  EXPECT_EQ(t.rows[4][column("ranks")], "zero2 x4");
  EXPECT_EQ(t.rows[4][column("global batch")], "16");
  EXPECT_EQ(t.rows[4][column("overlapped with backward")], "75%");  // 60, 70, 80, 90
  const std::string md = markdown_summary(d);
  EXPECT_TRUE(testing::contains(md, "### Ranks"));
  EXPECT_TRUE(testing::contains(md, "| 70% |"));

  // Without ddp on one rank the baseline is the one process, at the same per-rank batch.
  const ReportData e = analyze_records(dist_runs(false), {});
  const size_t e_ddp2 = dist_group(e, 2, Shard::kDdp);
  EXPECT_EQ(scaling_baseline(e, e_ddp2), dist_group(e, 1, Shard::kNone));
  EXPECT_NEAR(scaling_efficiency(e, e_ddp2), 1620 / (2 * 1000.0), 1e-12);

  // Another per-rank batch is another configuration: no baseline, no efficiency.
  std::vector<RunRecord> other = dist_runs(false);
  other[0].config.batch = 8;
  const ReportData f = analyze_records(other, {});
  EXPECT_FALSE(scaling_baseline(f, dist_group(f, 2, Shard::kDdp)).has_value());
  EXPECT_TRUE(std::isnan(scaling_efficiency(f, dist_group(f, 2, Shard::kDdp))));
}

TEST(DistributedReport, GroupsHoldEachRanksMemoryAndTheCommunication) {
  const ReportData d = analyze_records(dist_runs(), {});
  const Group& g = d.groups[dist_group(d, 4, Shard::kZero2)];
  ASSERT_EQ(g.rank_memory.size(), 4u);
  EXPECT_DOUBLE_EQ(g.rank_memory[3].at("activations").mean, 13 * kDistMiB);
  EXPECT_DOUBLE_EQ(g.rank_memory[3].at("optimizer_state").mean, 2 * kDistMiB);
  EXPECT_DOUBLE_EQ(g.rank_memory[3].at("grads").mean, 1 * kDistMiB);
  EXPECT_DOUBLE_EQ(g.rank_memory[3].at("collective_buffers").mean, kDistMiB);
  EXPECT_DOUBLE_EQ(g.memory.at("collective_buffers").mean, kDistMiB);
  EXPECT_NEAR(g.phase_s.at("communication").mean, 0.02, 1e-12);
  EXPECT_DOUBLE_EQ(g.bytes_sent_per_step.mean, kDistMiB);  // rank 0's
  EXPECT_NEAR(g.overlapped_share.mean, 0.75, 1e-12);
  EXPECT_EQ(g.shard, "zero2");
  // Labels name the ranks in words, the base label leaves them out.
  EXPECT_EQ(g.label, "adam, standard zero2 x4");
  EXPECT_EQ(g.base_label, "adam, standard");
  EXPECT_EQ(d.groups[dist_group(d, 1, Shard::kNone)].label, "adam, standard 1 process");
  const Group& one = d.groups[dist_group(d, 1, Shard::kNone)];
  EXPECT_TRUE(one.rank_memory.empty());
  EXPECT_EQ(one.memory.count("collective_buffers"), 0u);
  EXPECT_EQ(one.phase_s.count("communication"), 0u);
}

TEST(DistributedReport, CsvHasTheRanksAndTheCommunication) {
  const ReportData d = analyze_records(dist_runs(), {});
  const std::string csv = runs_csv(d);
  const std::string header = csv.substr(0, csv.find('\n'));
  for (const char* column : {",nproc,shard,", ",total_s,comm_s,",
                             ",other_bytes,collective_buffers_bytes,bytes_sent_per_step,"
                             "overlapped_share,"})
    EXPECT_TRUE(testing::contains(header, column)) << column;
  const std::string zero4 = "llama-zero2-4-0", one = "llama-none-1-0";
  EXPECT_EQ(dist_csv_cell(csv, zero4, "nproc"), "4");
  EXPECT_EQ(dist_csv_cell(csv, zero4, "shard"), "zero2");
  EXPECT_EQ(dist_csv_cell(csv, zero4, "comm_s"), "0.2");
  EXPECT_EQ(dist_csv_cell(csv, zero4, "collective_buffers_bytes"), "1048576");
  EXPECT_EQ(dist_csv_cell(csv, zero4, "bytes_sent_per_step"), "1048576");
  EXPECT_NEAR(std::stod(dist_csv_cell(csv, zero4, "overlapped_share")), 0.75, 1e-12);
  EXPECT_EQ(dist_csv_cell(csv, one, "nproc"), "1");
  EXPECT_EQ(dist_csv_cell(csv, one, "shard"), "none");
  EXPECT_EQ(dist_csv_cell(csv, one, "comm_s"), "");
  EXPECT_EQ(dist_csv_cell(csv, one, "bytes_sent_per_step"), "");
}

TEST(DistributedReport, FiguresOfRanksWithTheirNumbers) {
  if (!dist_gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed";
  testing::TempDir dir("gradscope-dist-report");
  const ReportData d = analyze_records(dist_runs(), {});
  const fs::path out = dir.fs_path() / "report";
  const std::vector<Figure> figures = write_report(d, out.string());
  const auto has = [&](const std::string& name) {
    return std::any_of(figures.begin(), figures.end(),
                       [&](const Figure& f) { return f.name == name; });
  };
  ASSERT_TRUE(has("rank-memory-llama"));
  ASSERT_TRUE(has("scaling-llama"));
  for (const char* ext : {".svg", ".png", ".gp", ".dat"}) {
    EXPECT_TRUE(fs::exists(out / "figures" / (std::string("rank-memory-llama") + ext)));
    EXPECT_TRUE(fs::exists(out / "figures" / (std::string("scaling-llama") + ext)));
  }
  // Memory per rank: the one process first, then every rank; MiB in the breakdown's order
  // (params, frozen, grads, optimizer state, buffers, activations, other).
  const std::string ranks = testing::slurp((out / "figures" / "rank-memory-llama.dat").string());
  EXPECT_TRUE(testing::contains(
      ranks,
      "# label\tparameters\tfrozen parameters\tgradients\toptimizer state\tcollective "
      "buffers\tactivations\tother\n"));
  EXPECT_EQ(dist_lines_starting(ranks, "adam, standard: 1 process\t"),
            std::vector<std::string>{"adam, standard: 1 process\t4\t0\t4\t8\t0\t10\t1"});
  EXPECT_EQ(dist_lines_starting(ranks, "adam, standard, zero2 x4: rank 3\t"),
            std::vector<std::string>{"adam, standard, zero2 x4: rank 3\t4\t0\t1\t2\t1\t13\t1"});
  EXPECT_EQ(dist_lines_starting(ranks, "adam, standard, ddp x2: rank ").size(), 2u);
  EXPECT_EQ(dist_lines_starting(ranks, "adam, standard: 1 process").size(), 1u);  // drawn once
  // Step time against ranks: ranks, step time (mean, lo, hi), tokens/s, efficiency (%).
  const std::string scaling = testing::slurp((out / "figures" / "scaling-llama.dat").string());
  EXPECT_TRUE(testing::contains(scaling,
                                "# zero2\n2\t0.13\t0.13\t0.13\t1440\t80\n"
                                "4\t0.15\t0.15\t0.15\t2520\t70\n"));
  EXPECT_TRUE(testing::contains(scaling,
                                "# ddp\n1\t0.11\t0.11\t0.11\t900\t100\n"
                                "2\t0.12\t0.12\t0.12\t1620\t90\n"));
  // Communication in the phases, collective buffers in the memory by component.
  const std::string phases = testing::slurp((out / "figures" / "phases-llama.dat").string());
  EXPECT_TRUE(testing::contains(phases, "backward\tcommunication\toptimizer"));
  const std::string memory = testing::slurp((out / "figures" / "memory-llama.dat").string());
  EXPECT_TRUE(testing::contains(memory, "optimizer state\tcollective buffers\tactivations"));
  const std::string html = testing::slurp((out / "report.html").string());
  EXPECT_TRUE(testing::contains(html, "id=\"fig-rank-memory-llama\""));
  EXPECT_TRUE(testing::contains(html, "id=\"fig-scaling-llama\""));
  EXPECT_TRUE(testing::contains(html, "<td>90%</td>"));
}

TEST(DistributedReport, OneRankCountDrawsNoScalingFigure) {
  if (!dist_gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed";
  testing::TempDir dir("gradscope-dist-one-count");
  // zero2 on 2 ranks alone: memory per rank, but nothing to scale against.
  const ReportData d = analyze_records({dist_run(2, Shard::kZero2, 1440, 0.13)}, {});
  const std::vector<Figure> figures = write_report(d, (dir.fs_path() / "report").string());
  std::set<std::string> kinds;
  for (const Figure& f : figures) kinds.insert(f.kind);
  EXPECT_TRUE(kinds.count("rank-memory"));
  EXPECT_FALSE(kinds.count("scaling"));
  // Nor without runs of several ranks: the one-process report is as it was.
  const ReportData one = analyze_records({dist_run(1, Shard::kNone, 1000, 0.1)}, {});
  testing::TempDir other("gradscope-dist-none");
  for (const Figure& f : write_report(one, (other.fs_path() / "report").string())) {
    EXPECT_NE(f.kind, "rank-memory");
    EXPECT_NE(f.kind, "scaling");
  }
  const std::string phases =
      testing::slurp((other.fs_path() / "report" / "figures" / "phases-llama.dat").string());
  EXPECT_FALSE(testing::contains(phases, "communication"));
  EXPECT_TRUE(ranks_table(one, "llama").rows.empty());
}

TEST(DistributedReport, SummaryOfARunWithSeveralRanks) {
  const RunRecord r = dist_run(2, Shard::kZero2, 1440, 0.13);
  const std::string text = summary_table(r);
  EXPECT_TRUE(testing::contains(text, "2 x zero2 (gloo, started by gradscope)")) << text;
  EXPECT_TRUE(testing::contains(text, "500 k of 1 M parameters per rank")) << text;
  EXPECT_TRUE(testing::contains(text, "rank 1 peak")) << text;
  EXPECT_TRUE(testing::contains(text, "20ms per step, 65% of gradients reduced during backward"))
      << text;
  const std::vector<std::string> sent = dist_lines_starting(text, "    sent per step (rank 0)");
  ASSERT_EQ(sent.size(), 1u) << text;
  EXPECT_TRUE(testing::contains(sent[0], "1.00 MiB")) << text;
  // One process: no such rows.
  EXPECT_FALSE(
      testing::contains(summary_table(dist_run(1, Shard::kNone, 1000, 0.1)), "rank 0 peak"));
}

// A shard name that a record carries is data: gnuplot's quotes and backquotes, HTML, a line
// break and a comment reach the figures, the page and the Markdown only escaped.
TEST(DistributedReport, AShardNameFromARecordStaysText) {
  if (!dist_gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed";
  testing::TempDir dir("gradscope-dist-hostile");
  const std::string marker = dir.file("PWNED");
  const std::string hostile =
      "zero2'`touch " + marker + "`\"<script>alert(1)</script>|\n#set output '/tmp/x'";
  Database db(dir.file("runs.db"));
  for (RunRecord r : dist_runs()) {
    if (r.distributed) r.distributed->shard = hostile;
    db.write_run(r);
  }
  const ReportData d = analyze(db, {});
  const fs::path out = dir.fs_path() / "report";
  write_report(d, out.string());
  EXPECT_FALSE(fs::exists(marker));
  const fs::path figures = out / "figures";
  const std::string gp = testing::slurp((figures / "scaling-llama.gp").string());
  // The title is one single-quoted string: quotes doubled, the line break a space.
  EXPECT_TRUE(testing::contains(gp, "title 'zero2''`touch")) << gp;
  EXPECT_FALSE(testing::contains(gp, "\n#set output")) << gp;
  for (const char* name : {"scaling-llama.dat", "rank-memory-llama.dat"}) {
    const std::string dat = testing::slurp((figures / name).string());
    EXPECT_FALSE(testing::contains(dat, "\"<script>")) << name;  // no quoted field opens
    EXPECT_FALSE(testing::contains(dat, "\n#set output")) << name;
  }
  // gnuplot writes it into the SVG as text, '<' as an entity.
  for (const char* name : {"scaling-llama.svg", "rank-memory-llama.svg"})
    EXPECT_FALSE(testing::contains(testing::slurp((figures / name).string()), "<script>")) << name;
  const std::string html = testing::slurp((out / "report.html").string());
  EXPECT_FALSE(testing::contains(html, "<script>alert(1)"));
  EXPECT_TRUE(testing::contains(html, "&lt;script&gt;alert(1)&lt;/script&gt;"));
  const std::string md = testing::slurp((out / "summary.md").string());
  // Markdown shows '<' that would open HTML backslash-escaped.
  EXPECT_TRUE(testing::contains(md, "\\<script>alert(1)\\</script>"));
  for (size_t at = md.find("<script>"); at != std::string::npos; at = md.find("<script>", at + 1))
    EXPECT_TRUE(at > 0 && md[at - 1] == '\\') << "raw HTML in summary.md";
  EXPECT_FALSE(testing::contains(md, "\n#set output"));
  EXPECT_TRUE(testing::contains(md, "\\|")) << "a '|' cannot split the table";
  // The terminal summary shows none of its control characters.
  RunRecord r = dist_run(2, Shard::kZero2, 1440, 0.13);
  r.distributed->shard = "zero2\x1b]0;title\x07";
  EXPECT_FALSE(testing::contains(summary_table(r), "\x1b"));
}

}  // namespace
}  // namespace gradscope
