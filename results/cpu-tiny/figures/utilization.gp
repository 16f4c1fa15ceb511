# Draws utilization.svg and utilization.png from utilization.dat: `gnuplot utilization.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 800,420 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 800,420 noenhanced font "sans,10" background rgb "white"
  }
  set output 'utilization.'.format
  set xlabel 'time since the run started (s)'
  set ylabel 'utilization (%)'
  set yrange [0:110]
  set grid
  set key bottom right
  plot 'utilization.dat' index 0 using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title 'llama (adadelta, standard)', 'utilization.dat' index 1 using 1:2 with lines lw 1.5 lc rgb '#d62728' title 'modernbert (adadelta, standard)', 'utilization.dat' index 2 using 1:2 with lines lw 1.5 lc rgb '#2ca02c' title 'nanovlm (adadelta, standard)', 'utilization.dat' index 3 using 1:2 with lines lw 1.5 lc rgb '#ff7f0e' title 'vit (adadelta, standard)'
  set output
}
