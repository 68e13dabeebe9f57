//! nccl-tests' table layout: widths, the time column's precision tiers and
//! C's `%g`, so oxccl's and nccl-tests' tables line up column for column.

/// C's `%g` (6 significant digits, trailing zeros dropped, exponent form
/// below 1e-4 and from 1e6 up).
pub fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let s = format!("{x:.5e}");
    let (mant, exp) = s.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip_zeros(mant), exp.abs())
    } else {
        strip_zeros(&format!("{:.*}", (5 - exp) as usize, x)).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// The time column: two decimals under 100 us, one under 10000 us, none above.
pub fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// One half (out-of-place or in-place) of a data line.
#[derive(Clone, Copy, Debug)]
pub struct Half {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements summed over ranks; None when not checked (`-c 0`).
    pub wrong: Option<u64>,
}

/// The cells of one half (time, algbw, busbw, #wrong); N/A when absent.
pub fn half_cells(h: Option<&Half>) -> String {
    half(h)
}

fn half(h: Option<&Half>) -> String {
    match h {
        Some(h) => {
            let w = h.wrong.map_or("N/A".to_string(), |w| fmt_g(w as f64));
            format!(
                "  {}  {:6.2}  {:6.2}  {:>5}",
                fmt_time(h.time_us),
                h.algbw,
                h.busbw,
                w
            )
        }
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// A data line: `%12li  %12li  %8s  %6s  %6s` then the two halves.
#[cfg(test)]
pub fn data_line(
    size: u64,
    count: usize,
    dtype: &str,
    redop: &str,
    root: i64,
    oop: &Half,
    ip: Option<&Half>,
) -> String {
    format!(
        "{size:>12}  {count:>12}  {dtype:>8}  {redop:>6}  {root:>6}{}{}",
        half(Some(oop)),
        half(ip)
    )
}

/// The cells before the halves: `%12li  %12li  %8s  %6s  %6s`.
pub fn line_start(size: u64, count: usize, dtype: &str, redop: &str, root: i64) -> String {
    format!("{size:>12}  {count:>12}  {dtype:>8}  {redop:>6}  {root:>6}")
}

/// A number in `width` columns: two decimals when they fit, then one, then
/// none, then exponent form (nccl-tests' cells of fixed width).
pub fn fit(x: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{x:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let prec = usize::from(width >= 7);
    format!("{x:>width$.prec$e}")
}

/// `-I`'s four cells after a half: i_min, i_max, i_p99 (us) and i_cv% (N/A without samples).
pub fn iter_cells(st: Option<&super::stats::IterStats>) -> String {
    match st {
        Some(st) => format!(
            "  {}  {}  {}  {}",
            fit(st.min * 1e6, 7),
            fit(st.max * 1e6, 7),
            fit(st.p99 * 1e6, 7),
            fit(st.cv_pct, 7)
        ),
        None => format!("  {:>7}  {:>7}  {:>7}  {:>7}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// A byte amount as nccl-tests' memory report writes it (`2.00 MB`, `12.5 GB`).
pub fn mem_string(bytes: u128) -> String {
    let mut x = bytes as f64;
    let mut unit = "B";
    for (scale, u) in [(1u64 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")] {
        if x >= scale as f64 {
            x /= scale as f64;
            unit = u;
            break;
        }
    }
    let prec = if x < 10.0 {
        2
    } else if x < 100.0 {
        1
    } else {
        0
    };
    format!("{x:.prec$} {unit}")
}

/// Which optional columns a table has.
#[derive(Clone, Copy, Debug, Default)]
pub struct Columns {
    /// `-C 1`: the time column is `cputime`.
    pub cputime: bool,
    /// `-S 1`: a `timestamp` column at the end.
    pub timestamps: bool,
    /// `-I 1`: i_min, i_max, i_p99, i_cv% after each half.
    pub per_iter: bool,
}

/// The three header rows above the data lines.
#[cfg(test)]
pub fn column_header() -> [String; 3] {
    column_header_with(Columns::default())
}

/// The header rows for a table with `cols`.
pub fn column_header_with(cols: Columns) -> [String; 3] {
    if cols.cputime || cols.timestamps || cols.per_iter {
        return extended_header(cols);
    }
    let pre = format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "", "", "", "", "");
    let l1 = format!(
        "{pre}{:>23}{:9}{:>22}{:10}",
        "out-of-place", "", "in-place", ""
    );
    let h = format!(
        "  {:>7}  {:>6}  {:>6} {:>6}",
        "time", "algbw", "busbw", "#wrong"
    );
    let l2 = format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{h}{h}",
        "size", "count", "type", "redop", "root"
    );
    let u = format!(
        "  {:>7}  {:>6}  {:>6}  {:>5}",
        "(us)", "(GB/s)", "(GB/s)", ""
    );
    let l3 = format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{u}{u}",
        "(B)", "(elements)", "", "", ""
    );
    [l1, l2, l3]
}

fn extended_header(cols: Columns) -> [String; 3] {
    let time = if cols.cputime { "cputime" } else { "time" };
    let pre = |a: &str, b: &str, c: &str, d: &str, e: &str| {
        format!("# {a:>10}  {b:>12}  {c:>8}  {d:>6}  {e:>6}")
    };
    let mut h = format!(
        "  {time:>7}  {:>6}  {:>6} {:>6}",
        "algbw", "busbw", "#wrong"
    );
    let mut u = format!(
        "  {:>7}  {:>6}  {:>6}  {:>5}",
        "(us)", "(GB/s)", "(GB/s)", ""
    );
    if cols.per_iter {
        h += &format!(
            "  {:>7}  {:>7}  {:>7}  {:>7}",
            "i_min", "i_max", "i_p99", "i_cv%"
        );
        u += &format!(
            "  {:>7}  {:>7}  {:>7}  {:>7}",
            "(us)", "(us)", "(us)", "(%)"
        );
    }
    let half_width = h.len();
    let title = |name: &str| format!("{name:^half_width$}");
    let (oop, ip) = if cols.per_iter {
        (
            "out-of-place (+ per-iteration)",
            "in-place (+ per-iteration)",
        )
    } else {
        ("out-of-place", "in-place")
    };
    let mut l1 = format!("{}{}{}", pre("", "", "", "", ""), title(oop), title(ip));
    let mut l2 = format!("{}{h}{h}", pre("size", "count", "type", "redop", "root"));
    let mut l3 = format!("{}{u}{u}", pre("(B)", "(elements)", "", "", ""));
    if cols.timestamps {
        l1 += &" ".repeat(21);
        l2 += &format!("{:>21}", "timestamp");
        l3 += &format!("{:>21}", "(%Y-%m-%d %H:%M:%S)");
    }
    [l1, l2, l3]
}

/// `--compare`'s cells after a data line: the other library's out-of-place
/// time, busbw and #wrong, then its time over oxccl's (above 1: oxccl is faster).
pub fn compare_cells(h: &Half, ratio: f64) -> String {
    let w = h.wrong.map_or("N/A".to_string(), |w| fmt_g(w as f64));
    format!(
        "  {}  {:6.2} {:>6}  {:6.2}",
        fmt_time(h.time_us),
        h.busbw,
        w,
        ratio
    )
}

/// `--compare`'s header cells, appended to the three header rows.
pub fn compare_header(label: &str) -> [String; 3] {
    let l1 = format!("  compare: {label}");
    let l2 = format!(
        "  {:>7}  {:>6} {:>6}  {:>6}",
        "time", "busbw", "#wrong", "ratio"
    );
    let l3 = format!("  {:>7}  {:>6} {:>6}  {:>6}", "(us)", "(GB/s)", "", "(x)");
    [l1, l2, l3]
}

/// The footer lines (nccl-tests' `# %-20s : ...`), then `#` and a blank line.
pub fn footer(errors: usize, avg_busbw: f64) -> String {
    format!(
        "# {:<20} : {} {}\n# {:<20} : {} \n#\n",
        "Out of bounds values",
        errors,
        if errors == 0 { "OK" } else { "FAILED" },
        "Avg bus bandwidth",
        fmt_g(avg_busbw)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_matches_c() {
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(70.742), "70.742");
        assert_eq!(fmt_g(3.0), "3");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(123456.0), "123456");
        assert_eq!(fmt_g(0.0001), "0.0001");
        assert_eq!(fmt_g(0.00001234), "1.234e-05");
        assert_eq!(fmt_g(2.5e-7), "2.5e-07");
        assert_eq!(fmt_g(1.0 / 3.0), "0.333333");
        assert_eq!(fmt_g(99.99999), "100");
    }

    #[test]
    fn optional_columns() {
        let [_, l2, l3] = column_header_with(Columns {
            cputime: true,
            timestamps: true,
            per_iter: true,
        });
        assert!(l2.contains("  cputime   algbw"), "{l2}");
        assert!(l2.contains("i_min    i_max    i_p99    i_cv%"), "{l2}");
        assert!(l2.ends_with("timestamp"), "{l2}");
        assert_eq!(l2.len(), l3.len());
        assert_eq!(fit(12.345, 7), "  12.35");
        assert_eq!(fit(1234.567, 7), "1234.57");
        assert_eq!(fit(123456.7, 7), " 123457");
        assert_eq!(mem_string(2 << 20), "2.00 MB");
        assert_eq!(mem_string(50 << 30), "50.0 GB");
        assert_eq!(mem_string(100), "100 B");
    }

    #[test]
    fn layout_matches_nccl_tests() {
        let oop = Half {
            time_us: 135.8,
            algbw: 0.0,
            busbw: 0.0,
            wrong: Some(0),
        };
        let ip = Half {
            time_us: 123.5,
            ..oop
        };
        assert_eq!(
            data_line(8, 2, "float", "sum", -1, &oop, Some(&ip)),
            "           8             2     float     sum      -1    135.8    0.00    0.00      0    123.5    0.00    0.00      0"
        );
        let big = Half {
            time_us: 12646.0,
            algbw: 169.81,
            busbw: 318.4,
            wrong: None,
        };
        assert!(data_line(2147483648, 536870912, "float", "sum", -1, &big, None)
            .starts_with("  2147483648     536870912     float     sum      -1    12646  169.81  318.40    N/A      N/A"));
        let [l1, l2, l3] = column_header();
        assert_eq!(l1, "#                                                              out-of-place                       in-place          ");
        assert_eq!(l2, "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong");
        assert_eq!(l3, "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ");
        // --compare's cells line up under their header.
        let cells = compare_cells(&oop, 1.234);
        let [_, h2, h3] = compare_header("libnccl.so 2.27.5");
        assert_eq!(cells, "    135.8    0.00      0    1.23");
        assert_eq!(h2, "     time   busbw #wrong   ratio");
        assert_eq!(h3.len(), cells.len());
        assert_eq!(
            footer(0, 70.742),
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 70.742 \n#\n"
        );
    }
}
