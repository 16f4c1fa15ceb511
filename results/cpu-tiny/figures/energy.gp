# Draws energy.svg and energy.png from energy.dat: `gnuplot energy.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 5120,582 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 5120,582 noenhanced font "sans,10" background rgb "white"
  }
  set output 'energy.'.format
  set style data histograms
  set style histogram rowstacked
  set style fill solid 0.85 border rgb '#333333'
  set boxwidth 0.7
  set key outside right top
  set grid ytics
  set ylabel 'joules'
  set xtics rotate by -35 left font ",10"
  set yrange [0:*]
  set bmargin 18
  plot 'energy.dat' using 2:xtic(1) title 'energy (J)' lc rgb '#1f77b4'
  set output
}
