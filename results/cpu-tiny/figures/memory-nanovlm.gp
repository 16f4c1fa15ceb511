# Draws memory-nanovlm.svg and memory-nanovlm.png from memory-nanovlm.dat: `gnuplot memory-nanovlm.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 1417,714 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 1417,714 noenhanced font "sans,10" background rgb "white"
  }
  set output 'memory-nanovlm.'.format
  set style fill solid 0.85 border rgb '#333333'
  set key outside right top vertical Left reverse
  set grid xtics
  set xlabel 'MiB'
  set xrange [0:*]
  set yrange [23.5:-0.5]
  set ytics scale 0
  set lmargin (format eq 'svg' ? 70 : 82)
  # The left end of column c's bar: the sum of the columns before it.
  lo(c) = c <= 2 ? 0 : sum [k=2:c-1] column(k)
  plot 'memory-nanovlm.dat' using (lo(2)+column(2)/2):0:(lo(2)):(lo(2)+column(2)):($0-0.35):($0+0.35):ytic(1) with boxxyerror title 'parameters' lc rgb '#1f77b4', \
       'memory-nanovlm.dat' using (lo(3)+column(3)/2):0:(lo(3)):(lo(3)+column(3)):($0-0.35):($0+0.35) with boxxyerror title 'frozen parameters' lc rgb '#d62728', \
       'memory-nanovlm.dat' using (lo(4)+column(4)/2):0:(lo(4)):(lo(4)+column(4)):($0-0.35):($0+0.35) with boxxyerror title 'gradients' lc rgb '#2ca02c', \
       'memory-nanovlm.dat' using (lo(5)+column(5)/2):0:(lo(5)):(lo(5)+column(5)):($0-0.35):($0+0.35) with boxxyerror title 'optimizer state' lc rgb '#ff7f0e', \
       'memory-nanovlm.dat' using (lo(6)+column(6)/2):0:(lo(6)):(lo(6)+column(6)):($0-0.35):($0+0.35) with boxxyerror title 'activations' lc rgb '#9467bd', \
       'memory-nanovlm.dat' using (lo(7)+column(7)/2):0:(lo(7)):(lo(7)+column(7)):($0-0.35):($0+0.35) with boxxyerror title 'other' lc rgb '#8c564b'
  set output
}
