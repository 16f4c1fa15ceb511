// `gradscope collect`: result files (a Slurm job's, or any folder of them) merged into a
// database, each attempt once, with what a job folder's runs.json expected (runner.h).
#include "gradscope/sweep/runner.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/sweep/slurm.h"

namespace gradscope {
namespace fs = std::filesystem;

CollectReport collect_results(const std::string& dir, Database& db) {
  const fs::path root = dir;
  std::error_code ec;
  check_usage(fs::is_directory(root, ec), fmt::format("{} is not a folder", dir),
              "pass the --out folder of `gradscope sweep --emit slurm`, or a folder of result "
              "files");
  const fs::path results = fs::is_directory(root / "results", ec) ? root / "results" : root;
  std::vector<fs::path> files;
  // Every .json entry is read as a record: one that is not a regular file (a FIFO, a folder,
  // a dangling link) is refused by name, not skipped.
  for (const auto& entry : fs::directory_iterator(results, ec))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  check_usage(!ec, fmt::format("cannot list {}: {}", results.string(), ec.message()),
              "check the folder's permissions");
  std::sort(files.begin(), files.end());

  CollectReport report;
  // File names that hold a run record -> its run id and whether its status is final.
  std::map<std::string, std::pair<std::string, bool>> accepted;
  for (const fs::path& file : files) {
    std::string why;
    const std::optional<RunRecord> record = read_result_file(file.string(), &why);
    if (!record) {
      report.refused.push_back(fmt::format("{}: {}", file.string(), why));
      continue;
    }
    accepted[file.filename().string()] = {record->run_id,
                                          record->status != RunStatus::kInterrupted};
    if (db.write_run_if_new(*record))
      ++report.merged;
    else
      ++report.present;
  }
  if (fs::exists(root / "runs.json", ec)) {
    try {
      const RunsFile runs = read_runs_file(root.string());
      const int64_t n = static_cast<int64_t>(runs.runs.size());
      report.expected = n;
      for (int64_t i = 0; i < n; ++i) {
        // A task's files hold its run (a file of another grid's task I does not count).
        bool any = false, final = false;
        for (const auto& [name, what] : accepted)
          if (is_task_result(name, i) && what.first == runs.runs[static_cast<size_t>(i)].run_id) {
            any = true;
            final = final || what.second;
          }
        if (!any)
          report.missing.push_back(std::to_string(i));
        else if (!final)
          report.interrupted.push_back(std::to_string(i));
      }
    } catch (const Error& e) {
      report.runs_file_error = e.what();
    }
  }
  return report;
}

}  // namespace gradscope
