# Draws memory-modernbert.svg and memory-modernbert.png from memory-modernbert.dat: `gnuplot memory-modernbert.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 1520,512 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 1520,512 noenhanced font "sans,10" background rgb "white"
  }
  set output 'memory-modernbert.'.format
  set style data histograms
  set style histogram rowstacked
  set style fill solid 0.85 border rgb '#333333'
  set boxwidth 0.7
  set key outside right top
  set grid ytics
  set ylabel 'MiB'
  set xtics rotate by -35 left font ",10"
  set yrange [0:*]
  set bmargin 13
  plot 'memory-modernbert.dat' using 2:xtic(1) title 'parameters' lc rgb '#1f77b4', 'memory-modernbert.dat' using 3 title 'gradients' lc rgb '#d62728', 'memory-modernbert.dat' using 4 title 'optimizer state' lc rgb '#2ca02c', 'memory-modernbert.dat' using 5 title 'activations' lc rgb '#ff7f0e', 'memory-modernbert.dat' using 6 title 'other' lc rgb '#9467bd'
  set output
}
