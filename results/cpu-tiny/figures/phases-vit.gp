# Draws phases-vit.svg and phases-vit.png from phases-vit.dat: `gnuplot phases-vit.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 1054,688 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 1054,688 noenhanced font "sans,10" background rgb "white"
  }
  set output 'phases-vit.'.format
  set style fill solid 0.85 border rgb '#333333'
  set key outside right top vertical Left reverse
  set grid xtics
  set xlabel 'ms per step'
  set xrange [0:*]
  set yrange [22.5:-0.5]
  set ytics scale 0
  set lmargin (format eq 'svg' ? 39 : 45)
  # The left end of column c's bar: the sum of the columns before it.
  lo(c) = c <= 2 ? 0 : sum [k=2:c-1] column(k)
  plot 'phases-vit.dat' using (lo(2)+column(2)/2):0:(lo(2)):(lo(2)+column(2)):($0-0.35):($0+0.35):ytic(1) with boxxyerror title 'data' lc rgb '#1f77b4', \
       'phases-vit.dat' using (lo(3)+column(3)/2):0:(lo(3)):(lo(3)+column(3)):($0-0.35):($0+0.35) with boxxyerror title 'forward' lc rgb '#d62728', \
       'phases-vit.dat' using (lo(4)+column(4)/2):0:(lo(4)):(lo(4)+column(4)):($0-0.35):($0+0.35) with boxxyerror title 'backward' lc rgb '#2ca02c', \
       'phases-vit.dat' using (lo(5)+column(5)/2):0:(lo(5)):(lo(5)+column(5)):($0-0.35):($0+0.35) with boxxyerror title 'optimizer' lc rgb '#ff7f0e'
  set output
}
