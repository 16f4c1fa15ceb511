// gnuplot, the program that draws the report's figures: each figure is a script NAME.gp and
// its data NAME.dat, run once to write NAME.svg and NAME.png beside them.
#pragma once

#include <filesystem>
#include <string>

namespace gradscope {

// A figure's script: the plotting commands `body` drawn once as SVG and once as PNG, at
// width x height pixels, from NAME.dat. `body` runs with the variable `format` set to "svg" or
// "png", for what must differ between the two (a margin measured in the font's cells).
std::string gnuplot_script(const std::string& name, int width, int height, const std::string& body);

// Runs `gnuplot NAME.gp` in dir; its output goes to NAME.log, removed when it succeeds. A usage
// error when `gnuplot` cannot be started, a runtime error with the log when it fails.
void run_gnuplot(const std::string& gnuplot, const std::filesystem::path& dir,
                 const std::string& name);

}  // namespace gradscope
