// `gradscope probe`: this device's GEMM FLOP/s per dtype and its memory bandwidth, printed
// beside the datasheet figures and stored in the database, where runs on the same host,
// device and thread count find it as their MFU denominator when the device is not in the
// datasheet table (measure/peak.h).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "gradscope/cli/commands.h"
#include "gradscope/core/error.h"
#include "gradscope/measure/peak.h"
#include "gradscope/core/files.h"
#include "gradscope/store/db.h"

namespace gradscope {
namespace {

struct ProbeCommandOptions {
  std::string device = "cpu";
  int threads = 0;
  double seconds = 3.0;
  std::string json_path;
  std::string db_path = "gradscope.db";
  bool no_db = false;
};

// 4.21e10 -> "42.1 GFLOP/s", 9.9e14 -> "990.0 TFLOP/s".
std::string format_flops(double flops_per_s) {
  if (flops_per_s >= 1e12) return fmt::format("{:.1f} TFLOP/s", flops_per_s / 1e12);
  return fmt::format("{:.1f} GFLOP/s", flops_per_s / 1e9);
}

void print_probe(const nlohmann::json& probe, const std::string& stored_in) {
  const std::string device_name = probe["device_name"].get<std::string>();
  const int threads = probe["threads"].get<int>();
  fmt::print("probe of {} ({}), {} thread{}, LibTorch {}, host {}\n", device_name,
             probe["device"].get<std::string>(), threads, threads == 1 ? "" : "s",
             probe["libtorch"].get<std::string>(), probe["host"].get<std::string>());
  fmt::print("{:<6} {:>6} {:>16} {:>16} {:>13}\n", "dtype", "n", "measured", "datasheet",
             "of datasheet");
  for (const auto& row : probe["gemm"]) {
    const std::string dtype = row["dtype"].get<std::string>();
    const double measured = row["flops_per_s"].get<double>();
    const auto known = known_peak_flops(device_name, dtype);
    fmt::print("{:<6} {:>6} {:>16} {:>16} {:>13}\n", dtype, row["n"].get<int64_t>(),
               format_flops(measured), known ? format_flops(*known) : "-",
               known ? fmt::format("{:.0f}%", 100.0 * measured / *known) : "");
  }
  for (const auto& [dtype, best] : probe["peak"].items()) {
    fmt::print("{:<6} {:>6} {:>16}\n", dtype, "best", format_flops(best.get<double>()));
  }
  const auto& bandwidth = probe["bandwidth_bytes_per_s"];
  if (bandwidth.is_number()) {
    fmt::print("memory bandwidth (tensor copy, bytes read + written): {:.1f} GB/s\n",
               bandwidth.get<double>() / 1e9);
  }
  for (const auto& s : probe["skipped"]) {
    fmt::print("skipped {} n={}: {}\n", s["dtype"].get<std::string>(), s["n"].get<int64_t>(),
               s["reason"].get<std::string>());
  }
  bool any_known = false;
  for (const auto& [dtype, best] : probe["peak"].items()) {
    const std::string source = known_peak_source(device_name, dtype);
    if (source.empty()) continue;
    if (!any_known) fmt::print("datasheet figures (MFU uses these for this device):\n");
    any_known = true;
    fmt::print("  {}: {}\n", dtype, source);
  }
  if (!any_known) {
    fmt::print("{} is not in the datasheet table: {}\n", device_name,
               stored_in.empty()
                   ? "store this probe (leave out --no-db) so that runs can use it for MFU"
                   : fmt::format("runs on this host with {} thread{} take MFU from this probe",
                                 threads, threads == 1 ? "" : "s"));
  }
}

int execute(const ProbeCommandOptions& o) {
  check_usage(o.threads >= 0, fmt::format("--threads {} must be 0 or more", o.threads),
              "pass --threads 0 for LibTorch's default, or the count to measure with");
  check_usage(std::isfinite(o.seconds) && o.seconds > 0,
              fmt::format("--seconds {} must be positive", o.seconds),
              "pass --seconds with a value such as 3");
  const torch::Device device = parse_device(o.device);
  if (!o.json_path.empty()) {
    check_output_path(o.json_path);
    check_output_file("--json", o.json_path, OutputKind::kProbeRecord);
  }
  check_distinct_outputs({{"--json", o.json_path}, {"--db", o.no_db ? "" : o.db_path}});
  // Opened before measuring so that a bad database path fails now, not after the probe.
  std::unique_ptr<Database> db;
  if (!o.no_db) db = std::make_unique<Database>(o.db_path);

  ProbeOptions options;
  options.threads = o.threads;
  options.seconds = o.seconds;
  const nlohmann::json probe = run_probe(device, options);

  std::string stored_in;
  if (db) stored_in = fmt::format("{} (probe {})", o.db_path, db->save_probe(probe));
  if (!o.json_path.empty()) write_json_atomically(o.json_path, probe);
  print_probe(probe, stored_in);
  if (!stored_in.empty()) fmt::print("stored in {}\n", stored_in);
  if (!o.json_path.empty()) fmt::print("record written to {}\n", o.json_path);
  return 0;
}

}  // namespace

void add_probe_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<ProbeCommandOptions>();
  CLI::App* cmd = root.add_subcommand(
      "probe",
      "Measure this device's peak: square matrix products (GEMM) per dtype at a few sizes\n"
      "(fp32; bf16 and fp16 on CUDA), best FLOP/s = 2 n^3 / time after a warm-up, and the\n"
      "memory bandwidth of a large tensor copy. Prints them beside the datasheet figures\n"
      "when the device is in gradscope's table, and stores the probe in the database, where\n"
      "runs on the same host, device and thread count take it as the peak for MFU when the\n"
      "device is not in the table.\n"
      "Example: gradscope probe --threads 2 --seconds 5");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Intra-op and BLAS threads to measure with (0 = LibTorch's default); a CPU "
                  "run finds the probe made with its own thread count")
      ->capture_default_str();
  cmd->add_option("--seconds", o->seconds,
                  "Time for the whole probe, shared between its measurements")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the probe record to this JSON file");
  cmd->add_option("--db", o->db_path, "SQLite results database")->capture_default_str();
  cmd->add_flag("--no-db", o->no_db, "Store nothing in the database");
  cmd->callback([o, &exit_code] { exit_code = execute(*o); });
}

}  // namespace gradscope
