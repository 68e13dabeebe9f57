//! `oxccl plot`: bus bandwidth and time against size, from `oxccl perf -J`
//! JSON files or nccl-tests' text output, as a hand-written SVG.
//!
//! Two panels side by side: bus bandwidth (GB/s, linear) against size (log2
//! axis), and time (µs) against size (log-log). One line per series: a series
//! is one (collective, data type, op) of one input, so a file that holds
//! several types or ops gives several lines. Every line is a `<polyline>`
//! with `class="series"`, `data-series` (its label) and `data-panel`
//! (`busbw` or `time`).

use crate::perf::progress::human_size;
use clap::Args;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `oxccl plot` flags.
#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Inputs are `oxccl perf -J` JSON files or saved nccl-tests output (the table
lines are read; the label comes from the file name and header). Each
(collective, type, op) of each input is one line in both panels. Rows of
size 0 are left out (log axes). Exit status: 0 ok, 2 bad input or arguments,
1 the output cannot be written.")]
pub struct PlotArgs {
    /// `oxccl perf -J` JSON files or nccl-tests text output
    #[arg(value_name = "RUN", required = true)]
    pub inputs: Vec<PathBuf>,
    /// The SVG file to write
    #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
    pub output: PathBuf,
    /// Plot the in-place columns instead of the out-of-place ones
    #[arg(long = "in-place")]
    pub in_place: bool,
    /// Title above the panels [default: the collectives plotted]
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
}

/// One point: size in bytes, time in µs, bus bandwidth in GB/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub size: u64,
    pub time_us: f64,
    pub busbw: f64,
}

/// One line of the plot.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub collective: String,
    pub points: Vec<Point>,
}

/// A bad input, reported on one line with exit status 2.
#[derive(Debug)]
pub struct InputError(pub String);

fn finite_point(size: u64, t: Option<f64>, bw: Option<f64>) -> Option<Point> {
    let (t, bw) = (t?, bw?);
    (size > 0 && t.is_finite() && t > 0.0 && bw.is_finite() && bw >= 0.0).then_some(Point {
        size,
        time_us: t,
        busbw: bw,
    })
}

/// Pushes `p` onto the series keyed by `key`, keeping first-seen order.
fn add(out: &mut Vec<(String, Series)>, key: String, make: impl FnOnce() -> Series, p: Point) {
    match out.iter_mut().find(|(k, _)| *k == key) {
        Some((_, s)) => s.points.push(p),
        None => {
            let mut s = make();
            s.points.push(p);
            out.push((key, s));
        }
    }
}

/// The first number among `keys` of a result half (nccl-tests' names, then
/// the older oxccl names).
fn num(h: &Value, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| h.get(*k).and_then(Value::as_f64))
}

/// The collective an nccl-tests command line ran: `.../all_reduce_perf` -> `all_reduce`.
fn collective_of_args(doc: &Value) -> Option<String> {
    let exe = doc.pointer("/args/0").and_then(Value::as_str)?;
    let name = exe.rsplit('/').next()?;
    Some(name.strip_suffix("_perf").unwrap_or(name).to_string())
}

/// The series of a `-J` document: nccl-tests' layout (what `oxccl perf -J`
/// writes, oxccl's additions under `oxccl`), or the older oxccl layout
/// (settings at the top level, `time_us` and `busbw_gbps`).
pub fn from_json(doc: &Value, in_place: bool) -> Result<Vec<Series>, String> {
    let results = doc
        .get("results")
        .and_then(Value::as_array)
        .ok_or("not an `oxccl perf -J` or nccl-tests -J file (no \"results\" list)")?;
    if results.is_empty() {
        return Err("no results (the run recorded no rows)".into());
    }
    // oxccl's settings: under `oxccl` now, at the top level in older files.
    let ox = doc.get("oxccl").unwrap_or(doc);
    let st = |k: &str| ox.get(k).and_then(Value::as_str);
    let coll = st("collective")
        .map(str::to_string)
        .or_else(|| collective_of_args(doc))
        .unwrap_or_else(|| "?".into());
    let nccl = doc
        .get("nccl_version")
        .and_then(Value::as_i64)
        .filter(|_| ox.get("library").is_none())
        .map(|v| format!("NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100));
    let lib = match (st("library"), st("library_version").or(st("oxccl_version"))) {
        (Some(l), Some(v)) => format!("{l} {v}"),
        (None, Some(v)) => format!("oxccl {v}"),
        (Some(l), None) => l.to_string(),
        (None, None) => nccl.unwrap_or_else(|| "oxccl".into()),
    };
    let nranks = ox
        .get("nranks")
        .and_then(Value::as_u64)
        .or_else(|| doc.pointer("/config/nranks").and_then(Value::as_u64))
        .or_else(|| {
            doc.get("ranks")
                .or_else(|| doc.pointer("/config/devices"))
                .and_then(Value::as_array)
                .map(|a| a.len() as u64)
        });
    let host = st("host")
        .map(str::to_string)
        .or_else(|| {
            doc.pointer("/ranks/0/host")
                .or_else(|| doc.pointer("/config/devices/0/hostname"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    let hosts = ox.get("hosts").and_then(Value::as_u64).unwrap_or(1);
    let machine = st("machine").unwrap_or("");
    let backend = st("backend").unwrap_or("");
    const TIME: [&str; 3] = ["time", "cpu_time", "time_us"];
    const BUSBW: [&str; 2] = ["bus_bw", "busbw_gbps"];
    let half_key = if in_place { "in_place" } else { "out_of_place" };
    let mut out: Vec<(String, Series)> = Vec::new();
    for r in results {
        let dtype = r.get("type").and_then(Value::as_str).unwrap_or("?");
        let op = r.get("redop").and_then(Value::as_str).unwrap_or("none");
        let Some(size) = r.get("size").and_then(Value::as_u64) else {
            continue;
        };
        let h = &r[half_key];
        let Some(p) = finite_point(size, num(h, &TIME), num(h, &BUSBW)) else {
            continue;
        };
        let key = format!("{dtype}/{op}");
        let make = || {
            let mut label = format!("{lib} {coll} {dtype}");
            if op != "none" {
                label += &format!(" {op}");
            }
            if let Some(n) = nranks {
                label += &format!(", {n} ranks");
            }
            if !host.is_empty() {
                label += &format!(", {host}");
                if hosts > 1 {
                    label += &format!(" +{}", hosts - 1);
                }
            }
            if !backend.is_empty() || !machine.is_empty() {
                label += &format!(" ({})", [backend, machine].join(" ").trim());
            }
            Series {
                label,
                collective: coll.clone(),
                points: Vec::new(),
            }
        };
        add(&mut out, key, make, p);
        // `--compare` runs: the other library's out-of-place line beside oxccl's.
        let c = &r["compare"];
        if in_place || c.is_null() {
            continue;
        }
        let Some(p) = finite_point(size, num(c, &TIME), num(c, &BUSBW)) else {
            continue;
        };
        let clib = ox
            .pointer("/compare/library")
            .and_then(Value::as_str)
            .unwrap_or("compared library");
        let make = || {
            let mut label = format!("{clib} {coll} {dtype}");
            if op != "none" {
                label += &format!(" {op}");
            }
            if let Some(n) = nranks {
                label += &format!(", {n} ranks");
            }
            if !host.is_empty() {
                label += &format!(", {host}");
            }
            label += " (--compare)";
            Series {
                label,
                collective: coll.clone(),
                points: Vec::new(),
            }
        };
        add(&mut out, format!("compare/{dtype}/{op}"), make, p);
    }
    if out.is_empty() {
        return Err(format!(
            "no {} results with a size above 0{}",
            half_key.replace('_', "-"),
            if in_place {
                " (alltoall and sendrecv have no in-place form)"
            } else {
                ""
            }
        ));
    }
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

/// The series of nccl-tests' (or `oxccl perf`'s) text output; `name` labels them.
pub fn from_text(text: &str, name: &str, in_place: bool) -> Result<Vec<Series>, String> {
    let mut coll = String::new();
    let mut nranks = 0usize;
    let mut host = String::new();
    let mut lib = String::new();
    let mut out: Vec<(String, Series)> = Vec::new();
    let mut rows = 0usize;
    for line in text.lines() {
        let l = line.trim();
        if let Some(c) = l.strip_prefix("# Collective test starting:") {
            coll = c.trim().trim_end_matches("_perf").to_string();
            continue;
        }
        if l.starts_with("# oxccl perf version") {
            lib = l
                .trim_start_matches("# oxccl perf version")
                .trim()
                .to_string();
            lib = format!("oxccl {}", lib.split_whitespace().next().unwrap_or(""));
            continue;
        }
        if let Some(v) = l.strip_prefix("# nccl-tests version") {
            lib = format!("nccl-tests {}", v.split_whitespace().next().unwrap_or(""));
            continue;
        }
        if let Some(rest) = l
            .strip_prefix("#  Rank")
            .or_else(|| l.strip_prefix("# Rank"))
        {
            nranks += 1;
            if host.is_empty() {
                if let Some((_, h)) = rest.split_once(" on ") {
                    host = h.split_whitespace().next().unwrap_or("").to_string();
                }
            }
            continue;
        }
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        // size count type redop root, then 4 out-of-place and 4 in-place fields.
        if f.len() < 9 || f[0].parse::<u64>().is_err() || f[1].parse::<u64>().is_err() {
            continue;
        }
        let base = if f[4].parse::<i64>().is_ok() { 5 } else { 4 };
        let half = if in_place { base + 4 } else { base };
        if f.len() < half + 3 {
            continue;
        }
        rows += 1;
        let size: u64 = f[0].parse().unwrap_or(0);
        let num = |s: &str| s.parse::<f64>().ok();
        let Some(p) = finite_point(size, num(f[half]), num(f[half + 2])) else {
            continue;
        };
        let (dtype, op) = (f[2], f[3]);
        let key = format!("{dtype}/{op}");
        let make = || {
            let c = if coll.is_empty() { "?" } else { coll.as_str() };
            let mut label = format!("{name}: {c} {dtype}");
            if op != "none" {
                label += &format!(" {op}");
            }
            if nranks > 0 {
                label += &format!(", {nranks} ranks");
            }
            if !host.is_empty() {
                label += &format!(", {host}");
            }
            if !lib.is_empty() {
                label += &format!(" ({lib})");
            }
            Series {
                label,
                collective: c.to_string(),
                points: Vec::new(),
            }
        };
        add(&mut out, key, make, p);
    }
    if rows == 0 {
        return Err("neither `oxccl perf -J` JSON nor nccl-tests output with result lines".into());
    }
    if out.is_empty() {
        return Err(format!(
            "no {} results with a size above 0",
            if in_place { "in-place" } else { "out-of-place" }
        ));
    }
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

/// Reads one input file (JSON when it starts with `{`, else text).
pub fn load(path: &Path, in_place: bool) -> Result<Vec<Series>, InputError> {
    let err = |m: String| InputError(format!("{}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot be read ({e})")))?;
    let name = path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    if text.trim_start().starts_with('{') {
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| err(format!("not valid JSON ({e})")))?;
        from_json(&doc, in_place).map_err(err)
    } else if text.trim().is_empty() {
        Err(err("empty file".into()))
    } else {
        from_text(&text, &name, in_place).map_err(err)
    }
}

/// Escapes text for XML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// Line colours (colour-blind-friendly, Okabe-Ito then Tableau).
const COLORS: [&str; 12] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8c564b",
    "#7f7f7f", "#bcbd22", "#9467bd", "#17becf",
];
const DASHES: [&str; 3] = ["", "6,3", "2,2"];

/// A 1-2-5 step giving at most `max_ticks` ticks up to `hi`, and the top.
fn linear_ticks(hi: f64, max_ticks: usize) -> (f64, Vec<f64>) {
    let hi = if hi > 0.0 && hi.is_finite() { hi } else { 1.0 };
    let raw = hi / max_ticks as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let top = (hi / step).ceil() * step;
    let n = (top / step).round() as usize;
    (top, (0..=n).map(|i| i as f64 * step).collect())
}

/// A tick value without float noise (0.1, 2.5, 40).
fn num_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if v.abs() >= 1e6 || v.abs() < 1e-3 {
        format!("{v:e}")
    } else {
        s.to_string()
    }
}

/// A time tick in µs as 100 ns, 10 µs, 1 ms, 10 s.
fn time_label(us: f64) -> String {
    let (v, unit) = if us < 1.0 {
        (us * 1e3, "ns")
    } else if us < 1e3 {
        (us, "µs")
    } else if us < 1e6 {
        (us / 1e3, "ms")
    } else {
        (us / 1e6, "s")
    };
    format!("{} {unit}", num_label((v * 1e3).round() / 1e3))
}

/// Panel geometry: the plot area's left, top, width and height.
struct Panel {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

/// Renders the series as an SVG document.
pub fn render(series: &[Series], title: &str, in_place: bool) -> String {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut kmin, mut kmax) = (f64::MAX, f64::MIN);
    let (mut tmin, mut tmax, mut bwmax) = (f64::MAX, f64::MIN, 0f64);
    for p in pts {
        let k = (p.size as f64).log2();
        kmin = kmin.min(k);
        kmax = kmax.max(k);
        tmin = tmin.min(p.time_us);
        tmax = tmax.max(p.time_us);
        bwmax = bwmax.max(p.busbw);
    }
    // x: whole powers of two around the data.
    let (mut k0, mut k1) = (kmin.floor(), kmax.ceil());
    if k1 - k0 < 2.0 {
        k0 -= 1.0;
        k1 += 1.0;
    }
    k0 = k0.max(0.0);
    let kstep = ((k1 - k0) / 8.0).ceil().max(1.0);
    // Ticks from the smallest size up, every kstep powers of two.
    let kstep = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0]
        .into_iter()
        .find(|s| *s >= kstep)
        .unwrap_or(kstep);
    let xticks: Vec<f64> = {
        let mut v = Vec::new();
        let mut k = k0;
        while k <= k1 + 1e-9 {
            v.push(k);
            k += kstep;
        }
        v
    };
    // time: whole decades around the data.
    let (d0, mut d1) = (tmin.log10().floor(), tmax.log10().ceil());
    if d1 <= d0 {
        d1 = d0 + 1.0;
    }
    let (bwtop, bwticks) = linear_ticks(bwmax * 1.05, 6);

    let (pw, ph) = (420.0, 320.0);
    let left = Panel {
        x: 80.0,
        y: 70.0,
        w: pw,
        h: ph,
    };
    let right = Panel {
        x: 80.0 + pw + 100.0,
        y: 70.0,
        w: pw,
        h: ph,
    };
    let width = right.x + pw + 30.0;
    let legend_y = left.y + ph + 70.0;
    let height = legend_y + 22.0 * series.len() as f64 + 16.0;
    let xmap = |p: &Panel, size: u64| p.x + ((size as f64).log2() - k0) / (k1 - k0) * p.w;
    let xk = |p: &Panel, k: f64| p.x + (k - k0) / (k1 - k0) * p.w;
    let ybw = |p: &Panel, v: f64| p.y + p.h - v / bwtop * p.h;
    let yt = |p: &Panel, t: f64| p.y + p.h - (t.log10() - d0) / (d1 - d0) * p.h;

    let mut o = String::new();
    let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        o,
        r#"<style>.grid{{stroke:#e4e4e4;stroke-width:1}} .axis{{stroke:#333;stroke-width:1;fill:none}} .series{{fill:none;stroke-width:2;stroke-linejoin:round}} .tick{{fill:#333}} .label{{fill:#111;font-size:13px}} .title{{font-size:16px;font-weight:bold}}</style>"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text class="title" x="{:.0}" y="28" text-anchor="middle">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    let which = if in_place { "in-place" } else { "out-of-place" };
    for (p, name, ylabel) in [
        (&left, "busbw", format!("bus bandwidth (GB/s), {which}")),
        (&right, "time", format!("time, {which} (log scale)")),
    ] {
        let _ = writeln!(o, r#"<g class="panel" data-panel="{name}">"#);
        // Grid and ticks: x.
        for &k in &xticks {
            let x = xk(p, k);
            let _ = writeln!(
                o,
                r#"<line class="grid" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/>"#,
                p.y,
                p.y + p.h
            );
            let _ = writeln!(
                o,
                r#"<text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                p.y + p.h + 16.0,
                esc(&human_size(2f64.powf(k) as u64))
            );
        }
        // Grid and ticks: y.
        let yt_list: Vec<(f64, String)> = if name == "busbw" {
            bwticks.iter().map(|&v| (ybw(p, v), num_label(v))).collect()
        } else {
            let mut v = Vec::new();
            let mut d = d0;
            while d <= d1 + 1e-9 {
                v.push((yt(p, 10f64.powf(d)), time_label(10f64.powf(d))));
                d += 1.0;
            }
            v
        };
        for (y, lab) in &yt_list {
            let _ = writeln!(
                o,
                r#"<line class="grid" x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/>"#,
                p.x,
                p.x + p.w
            );
            let _ = writeln!(
                o,
                r#"<text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                p.x - 6.0,
                y + 4.0,
                esc(lab)
            );
        }
        let _ = writeln!(
            o,
            r#"<rect class="axis" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
            p.x, p.y, p.w, p.h
        );
        let _ = writeln!(
            o,
            r#"<text class="label axis-label" data-axis="x" x="{:.1}" y="{:.1}" text-anchor="middle">message size (bytes, log2 scale)</text>"#,
            p.x + p.w / 2.0,
            p.y + p.h + 40.0
        );
        let (lx, ly) = (p.x - 55.0, p.y + p.h / 2.0);
        let _ = writeln!(
            o,
            r#"<text class="label axis-label" data-axis="y" x="{lx:.1}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
            esc(&ylabel)
        );
        // The lines.
        for (i, s) in series.iter().enumerate() {
            let mut pts: Vec<&Point> = s.points.iter().collect();
            pts.sort_by_key(|p| p.size);
            let coords: Vec<String> = pts
                .iter()
                .map(|q| {
                    let y = if name == "busbw" {
                        ybw(p, q.busbw)
                    } else {
                        yt(p, q.time_us)
                    };
                    format!("{:.1},{:.1}", xmap(p, q.size), y)
                })
                .collect();
            let color = COLORS[i % COLORS.len()];
            let dash = DASHES[(i / COLORS.len()) % DASHES.len()];
            let dash = if dash.is_empty() {
                String::new()
            } else {
                format!(r#" stroke-dasharray="{dash}""#)
            };
            let _ = writeln!(
                o,
                r#"<polyline class="series" data-series="{}" data-panel="{name}" stroke="{color}"{dash} points="{}"/>"#,
                esc(&s.label),
                coords.join(" ")
            );
            let _ = write!(o, r#"<g class="markers" fill="{color}">"#);
            for c in &coords {
                let (x, y) = c.split_once(',').expect("x,y");
                let _ = write!(o, r#"<circle cx="{x}" cy="{y}" r="2.5"/>"#);
            }
            let _ = writeln!(o, "</g>");
        }
        let _ = writeln!(o, "</g>");
    }
    // Legend.
    let _ = writeln!(o, r#"<g class="legend">"#);
    for (i, s) in series.iter().enumerate() {
        let y = legend_y + 22.0 * i as f64;
        let color = COLORS[i % COLORS.len()];
        let dash = DASHES[(i / COLORS.len()) % DASHES.len()];
        let dash = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            o,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" data-legend="{}">{}</text>"#,
            left.x,
            left.x + 30.0,
            left.x + 38.0,
            y + 4.0,
            esc(&s.label),
            esc(&s.label)
        );
    }
    let _ = writeln!(o, "</g>");
    let _ = writeln!(o, "</svg>");
    o
}

/// Runs `oxccl plot`; returns the exit status.
pub fn main(a: &PlotArgs) -> i32 {
    let mut series = Vec::new();
    for p in &a.inputs {
        match load(p, a.in_place) {
            Ok(s) => series.extend(s),
            Err(e) => {
                eprintln!("oxccl plot: {}", e.0);
                return 2;
            }
        }
    }
    let ext = a
        .output
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if ext.as_deref() != Some("svg") {
        eprintln!(
            "oxccl plot: -o/--output {}: only SVG is written (accepted: a path ending in .svg)",
            a.output.display()
        );
        return 2;
    }
    let title = a.title.clone().unwrap_or_else(|| {
        let mut c: Vec<&str> = series.iter().map(|s| s.collective.as_str()).collect();
        c.dedup();
        c.sort_unstable();
        c.dedup();
        format!("{}: bus bandwidth and time by message size", c.join(", "))
    });
    let svg = render(&series, &title, a.in_place);
    if let Err(e) = std::fs::write(&a.output, svg) {
        eprintln!(
            "oxccl plot: -o/--output {}: cannot be written ({e})",
            a.output.display()
        );
        return 1;
    }
    let points: usize = series.iter().map(|s| s.points.len()).sum();
    println!(
        "wrote {} ({} series, {points} points)",
        a.output.display(),
        series.len()
    );
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        let (top, t) = linear_ticks(9.3, 6);
        assert_eq!(top, 10.0);
        assert_eq!(t, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let (top, _) = linear_ticks(0.0, 6);
        assert!(top > 0.0);
        assert_eq!(num_label(0.30000000000000004), "0.3");
        assert_eq!(num_label(1000.0), "1000");
        assert_eq!(time_label(0.1), "100 ns");
        assert_eq!(time_label(10.0), "10 µs");
        assert_eq!(time_label(1e5), "100 ms");
        assert_eq!(time_label(1e7), "10 s");
    }

    #[test]
    fn text_rows_group_by_type_and_op() {
        let t = "# Collective test starting: all_reduce_perf\n\
#  Rank  0 Group  0 Pid   1 on      box1 device  0 [0x1] NVIDIA H200\n\
#  Rank  1 Group  0 Pid   2 on      box1 device  1 [0x2] NVIDIA H200\n\
           8             2     float     sum      -1    16.68    0.00    0.00      0    16.64    0.00    0.00      0\n\
          32             8     float     sum      -1    18.81    0.00    0.00      0    17.91    0.00    0.00      0\n\
           8             8      int8     sum      -1    18.59    0.00    0.00      0    17.17    0.00    0.00      0\n\
           0             0      int8     sum      -1     1.00    0.00    0.00      0     1.00    0.00    0.00      0\n";
        let s = from_text(t, "nv", false).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, "nv: all_reduce float sum, 2 ranks, box1");
        assert_eq!(s[0].points.len(), 2);
        assert_eq!(s[1].points.len(), 1, "size 0 left out");
        let ip = from_text(t, "nv", true).unwrap();
        assert_eq!(ip[0].points[0].time_us, 16.64);
        assert!(from_text("hello\n", "x", false).is_err());
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(esc(r#"a<b & "c""#), "a&lt;b &amp; &quot;c&quot;");
    }
}
