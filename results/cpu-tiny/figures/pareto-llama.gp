# Draws pareto-llama.svg and pareto-llama.png from pareto-llama.dat: `gnuplot pareto-llama.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 760,480 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 760,480 noenhanced font "sans,10" background rgb "white"
  }
  set output 'pareto-llama.'.format
  set xlabel 'peak memory (MiB)'
  set ylabel 'training loss at equal samples'
  set grid
  set key top right
  set offsets graph 0.05, graph 0.25, graph 0.08, graph 0.08
  plot 'pareto-llama.dat' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' title 'Pareto front', \
       'pareto-llama.dat' index 0 using 1:2 with points pt 7 ps 1.2 lc rgb '#1f77b4' title 'configurations', \
       'pareto-llama.dat' index 0 using 1:2:3 with labels left offset 0.8,0.4 font ',9' notitle
  set output
}
