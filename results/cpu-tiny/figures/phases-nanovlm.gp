# Draws phases-nanovlm.svg and phases-nanovlm.png from phases-nanovlm.dat: `gnuplot phases-nanovlm.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 1520,512 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 1520,512 noenhanced font "sans,10" background rgb "white"
  }
  set output 'phases-nanovlm.'.format
  set style data histograms
  set style histogram rowstacked
  set style fill solid 0.85 border rgb '#333333'
  set boxwidth 0.7
  set key outside right top
  set grid ytics
  set ylabel 'ms per step'
  set xtics rotate by -35 left font ",10"
  set yrange [0:*]
  set bmargin 13
  plot 'phases-nanovlm.dat' using 2:xtic(1) title 'data' lc rgb '#1f77b4', 'phases-nanovlm.dat' using 3 title 'forward' lc rgb '#d62728', 'phases-nanovlm.dat' using 4 title 'backward' lc rgb '#2ca02c', 'phases-nanovlm.dat' using 5 title 'optimizer' lc rgb '#ff7f0e'
  set output
}
