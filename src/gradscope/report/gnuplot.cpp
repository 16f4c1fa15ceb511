#include "gradscope/report/gnuplot.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/report/encode.h"
#include "gradscope/report/files.h"

namespace gradscope {

namespace fs = std::filesystem;

namespace {

// A figure's name goes into file names, the script and the page: it must be a slug.
void check_figure_name(const std::string& name) {
  const bool safe =
      !name.empty() && name[0] != '-' && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      });
  if (!safe) fail_runtime("a figure name is not a file slug: " + file_slug(name));
}

}  // namespace

std::string gnuplot_script(const std::string& name, int width, int height,
                           const std::string& body) {
  check_figure_name(name);
  return fmt::format(
      "# Draws {0}.svg and {0}.png from {0}.dat: `gnuplot {0}.gp`.\n"
      "set datafile separator \"\\t\"\n"
      "set datafile missing \"NaN\"\n"
      "do for [format in \"svg png\"] {{\n"
      "  if (format eq \"svg\") {{\n"
      "    set terminal svg size {1},{2} fixed noenhanced font \"sans,12\" background rgb "
      "\"white\"\n"
      "  }} else {{\n"
      "    set terminal pngcairo size {1},{2} noenhanced font \"sans,10\" background rgb "
      "\"white\"\n"
      "  }}\n"
      "  set output {4}.format\n"
      "{3}"
      "  set output\n"
      "}}\n",
      name, width, height, body, gnuplot_string(name + "."));
}

void run_gnuplot(const std::string& gnuplot, const fs::path& dir, const std::string& name) {
  check_figure_name(name);
  const fs::path log = dir / (name + ".log");
  const pid_t pid = fork();
  if (pid < 0)
    fail_runtime(std::string("cannot start gnuplot: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (chdir(dir.c_str()) != 0) _exit(126);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    const std::string script = "./" + name + ".gp";  // never read as an option
    execlp(gnuplot.c_str(), gnuplot.c_str(), script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code == 127)
    fail_usage(fmt::format("cannot run '{}'", gnuplot),
               "install gnuplot-nox (scripts/install-deps.sh does), pass --gnuplot PATH, or "
               "use --format md or csv");
  if (code != 0)
    fail_runtime(
        fmt::format("gnuplot failed on {}: {}", (dir / (name + ".gp")).string(), read_file(log)),
        "the figure's script and data are kept beside it");
  std::error_code ec;
  fs::remove(log, ec);
}

}  // namespace gradscope
