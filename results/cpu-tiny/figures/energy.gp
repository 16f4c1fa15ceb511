# Draws energy.svg and energy.png from energy.dat: `gnuplot energy.gp`.
set datafile separator "\t"
set datafile missing "NaN"
do for [format in "svg png"] {
  if (format eq "svg") {
    set terminal svg size 1296,2534 fixed noenhanced font "sans,12" background rgb "white"
  } else {
    set terminal pngcairo size 1296,2534 noenhanced font "sans,10" background rgb "white"
  }
  set output 'energy.'.format
  set style fill solid 0.85 border rgb '#333333'
  unset key
  set grid xtics
  set xlabel 'energy (J)'
  set xrange [0:*]
  set yrange [93.5:-0.5]
  set ytics scale 0
  set lmargin (format eq 'svg' ? 79 : 92)
  set rmargin 4
  # The left end of column c's bar: the sum of the columns before it.
  lo(c) = c <= 2 ? 0 : sum [k=2:c-1] column(k)
  plot 'energy.dat' using (lo(2)+column(2)/2):0:(lo(2)):(lo(2)+column(2)):($0-0.35):($0+0.35):ytic(1) with boxxyerror title 'energy (J)' lc rgb '#1f77b4'
  set output
}
