//! End-to-end tests of `oxccl plot`: real `oxccl perf -J` runs plotted, the
//! SVG checked for well-formed XML, one series per input (and per type),
//! axis labels, and bad input (one line, exit status 2).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_oxccl");

fn oxccl(args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).stdin(Stdio::null());
    for v in [
        "RANK",
        "WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "NCCL_COMM_ID",
        "OXCCL_PERF_RANK",
    ] {
        c.env_remove(v);
    }
    c.output().expect("run oxccl")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-plot-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An element: name, attributes, and whether it closed itself.
#[derive(Debug)]
struct Elem {
    name: String,
    attrs: Vec<(String, String)>,
}

impl Elem {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

fn check_text(t: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = t;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let end = rest[i..].find(';').ok_or("unterminated entity")?;
        let ent = &rest[i + 1..i + end];
        out.push(match ent {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => return Err(format!("unknown entity &{ent};")),
        });
        rest = &rest[i + end + 1..];
    }
    if rest.contains('<') {
        return Err("'<' in text".into());
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'))
        && !s.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.')
}

/// A small XML well-formedness check (elements, attributes, entities, one
/// root, matched nesting; the prolog and comments allowed): returns every
/// element in document order, or what is wrong.
fn parse_xml(doc: &str) -> Result<Vec<Elem>, String> {
    let mut elems = Vec::new();
    let mut stack: Vec<String> = Vec::new();
    let mut roots = 0;
    let mut s = doc.trim_start();
    if let Some(r) = s.strip_prefix("<?xml") {
        s = &r[r.find("?>").ok_or("unterminated prolog")? + 2..];
    }
    loop {
        let lt = match s.find('<') {
            Some(i) => i,
            None => {
                if !s.trim().is_empty() && stack.is_empty() {
                    return Err("text after the root".into());
                }
                check_text(s)?;
                break;
            }
        };
        let text = &s[..lt];
        if stack.is_empty() && !text.trim().is_empty() {
            return Err("text outside the root".into());
        }
        check_text(text)?;
        s = &s[lt..];
        if let Some(r) = s.strip_prefix("<!--") {
            s = &r[r.find("-->").ok_or("unterminated comment")? + 3..];
            continue;
        }
        let gt = s.find('>').ok_or("unterminated tag")?;
        let tag = &s[1..gt];
        s = &s[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or("close without open")?;
            if open != name.trim() {
                return Err(format!("</{name}> closes <{open}>"));
            }
            continue;
        }
        let (body, selfclose) = match tag.strip_suffix('/') {
            Some(b) => (b, true),
            None => (tag, false),
        };
        let name_end = body.find(|c: char| c.is_whitespace()).unwrap_or(body.len());
        let name = &body[..name_end];
        if !is_name(name) {
            return Err(format!("bad element name '{name}'"));
        }
        let mut attrs = Vec::new();
        let mut a = body[name_end..].trim_start();
        while !a.is_empty() {
            let eq = a
                .find('=')
                .ok_or(format!("attribute without value in <{name}>"))?;
            let k = a[..eq].trim();
            if !is_name(k) {
                return Err(format!("bad attribute name '{k}'"));
            }
            let r = a[eq + 1..].trim_start();
            let q = r.chars().next().ok_or("missing quote")?;
            if q != '"' && q != '\'' {
                return Err(format!("unquoted attribute {k}"));
            }
            let end = r[1..].find(q).ok_or("unterminated attribute")?;
            let v = check_text(&r[1..1 + end])?;
            if attrs.iter().any(|(n, _): &(String, String)| n == k) {
                return Err(format!("duplicate attribute {k}"));
            }
            attrs.push((k.to_string(), v));
            a = r[end + 2..].trim_start();
        }
        if stack.is_empty() {
            roots += 1;
        }
        elems.push(Elem {
            name: name.to_string(),
            attrs,
        });
        if !selfclose {
            stack.push(name.to_string());
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed <{}>", stack.join("> <")));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(elems)
}

#[test]
fn the_xml_check_catches_mistakes() {
    assert!(parse_xml("<svg><g a=\"1\"/></svg>").is_ok());
    assert!(parse_xml("<svg><g></svg>").is_err());
    assert!(parse_xml("<svg a=1/>").is_err());
    assert!(parse_xml("<svg>a & b</svg>").is_err());
    assert!(parse_xml("<svg/><svg/>").is_err());
    assert!(parse_xml("<svg a=\"1\" a=\"2\"/>").is_err());
}

/// The polylines of a panel: their data-series labels.
fn series_of(elems: &[Elem], panel: &str) -> Vec<String> {
    elems
        .iter()
        .filter(|e| e.name == "polyline" && e.attr("class") == Some("series"))
        .filter(|e| e.attr("data-panel") == Some(panel))
        .map(|e| e.attr("data-series").unwrap().to_string())
        .collect()
}

fn perf_json(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let p = dir.join(name);
    let mut a = vec![
        "perf", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-J",
    ];
    a.push(p.to_str().unwrap());
    a.extend_from_slice(extra);
    let out = oxccl(&a);
    ok(&out);
    p
}

#[test]
fn plots_one_series_per_run_and_type() {
    let dir = tmpdir("runs");
    let a = perf_json(&dir, "a.json", &["all_reduce", "--ranks", "2"]);
    let b = perf_json(
        &dir,
        "b.json",
        &[
            "all_gather",
            "--ranks",
            "3",
            "--launch",
            "thread",
            "-d",
            "float,int8",
        ],
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a).unwrap()).unwrap();
    let ox = &doc["oxccl"];
    assert_eq!(ox["library"], "oxccl");
    assert!(ox["library_version"].is_string());
    assert!(!ox["host"].as_str().unwrap().is_empty());
    assert!(ox["machine"].is_string());
    assert_eq!(ox["hosts"], 1);
    // nccl-tests-style text output of a third run.
    let txt = dir.join("reduce-run.txt");
    let out = oxccl(&[
        "perf", "reduce", "--ranks", "2", "-b", "8", "-e", "4K", "-f", "4", "-n", "2", "-w", "1",
    ]);
    ok(&out);
    std::fs::write(&txt, &out.stdout).unwrap();

    let svg = dir.join("out.svg");
    let out = oxccl(&[
        "plot",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        txt.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    ok(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!("wrote {} (", svg.display())),
        "{said}"
    );
    assert!(out.stderr.is_empty());
    let text = std::fs::read_to_string(&svg).unwrap();
    let elems = parse_xml(&text).unwrap_or_else(|e| panic!("SVG not well-formed: {e}"));
    assert_eq!(elems[0].name, "svg");
    assert_eq!(elems[0].attr("xmlns"), Some("http://www.w3.org/2000/svg"));
    let bw = series_of(&elems, "busbw");
    let time = series_of(&elems, "time");
    assert_eq!(bw.len(), 4, "{bw:?}");
    assert_eq!(bw, time);
    assert_eq!(
        bw.iter().collect::<BTreeSet<_>>().len(),
        4,
        "distinct labels"
    );
    assert!(
        bw[0].contains("all_reduce float sum") && bw[0].contains("2 ranks"),
        "{bw:?}"
    );
    assert!(
        bw[1].contains("all_gather float") && bw[1].contains("3 ranks"),
        "{bw:?}"
    );
    assert!(bw[2].contains("all_gather int8"), "{bw:?}");
    assert!(
        bw[3].starts_with("reduce-run: reduce float sum, 2 ranks"),
        "{bw:?}"
    );
    // Points: sizes 8, 64, 512, 4K, 32K for the JSON runs.
    let pl = elems
        .iter()
        .find(|e| e.name == "polyline")
        .unwrap()
        .attr("points")
        .unwrap();
    assert_eq!(pl.split_whitespace().count(), 5, "{pl}");
    for xy in pl.split_whitespace() {
        let (x, y) = xy.split_once(',').unwrap();
        assert!(x.parse::<f64>().unwrap().is_finite() && y.parse::<f64>().unwrap().is_finite());
    }
    // Axis labels and size ticks.
    let axis: Vec<&Elem> = elems
        .iter()
        .filter(|e| e.attr("class") == Some("label axis-label"))
        .collect();
    assert_eq!(axis.len(), 4);
    for want in [
        "message size (bytes, log2 scale)",
        "bus bandwidth (GB/s), out-of-place",
        "time, out-of-place (log scale)",
        ">8 B<",
        ">32 KB<",
        "µs<",
    ] {
        assert!(text.contains(want), "missing {want}");
    }
    // Legend: one entry per series.
    assert_eq!(
        elems
            .iter()
            .filter(|e| e.attr("data-legend").is_some())
            .count(),
        4
    );

    // --in-place plots the other column.
    let svg2 = dir.join("ip.svg");
    let out = oxccl(&[
        "plot",
        "--in-place",
        a.to_str().unwrap(),
        "-o",
        svg2.to_str().unwrap(),
    ]);
    ok(&out);
    let t2 = std::fs::read_to_string(&svg2).unwrap();
    let e2 = parse_xml(&t2).unwrap();
    assert_eq!(series_of(&e2, "busbw").len(), 1);
    assert!(t2.contains("bus bandwidth (GB/s), in-place"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn bad(args: &[&str], want: &str) {
    let out = oxccl(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("oxccl"), "{err}");
    assert!(err.contains(want), "{args:?}: want '{want}' in {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_input_is_one_line_and_status_2() {
    let dir = tmpdir("bad");
    let svg = dir.join("o.svg");
    let o = svg.to_str().unwrap();
    let missing = dir.join("missing.json");
    bad(
        &["plot", missing.to_str().unwrap(), "-o", o],
        "cannot be read",
    );
    let notjson = dir.join("broken.json");
    std::fs::write(&notjson, "{ \"results\": [1, ").unwrap();
    bad(
        &["plot", notjson.to_str().unwrap(), "-o", o],
        "not valid JSON",
    );
    let other = dir.join("other.json");
    std::fs::write(&other, "{\"a\": 1}").unwrap();
    bad(
        &["plot", other.to_str().unwrap(), "-o", o],
        "no \"results\" list",
    );
    let empty = dir.join("empty.json");
    std::fs::write(&empty, "{\"collective\": \"all_reduce\", \"results\": []}").unwrap();
    bad(&["plot", empty.to_str().unwrap(), "-o", o], "no results");
    let blank = dir.join("blank.txt");
    std::fs::write(&blank, "").unwrap();
    bad(&["plot", blank.to_str().unwrap(), "-o", o], "empty file");
    let prose = dir.join("notes.txt");
    std::fs::write(&prose, "hello\nworld\n").unwrap();
    bad(&["plot", prose.to_str().unwrap(), "-o", o], "result lines");
    // alltoall has no in-place column.
    let a2a = dir.join("a2a.json");
    std::fs::write(
        &a2a,
        r#"{"collective":"alltoall","results":[{"size":8,"type":"float","redop":"none","out_of_place":{"time_us":1.0,"busbw_gbps":0.1},"in_place":null}]}"#,
    )
    .unwrap();
    bad(
        &["plot", "--in-place", a2a.to_str().unwrap(), "-o", o],
        "no in-place results",
    );
    bad(&["plot", a2a.to_str().unwrap(), "-o", "x.png"], "only SVG");
    bad(&["plot", "-o", o], "required");
    bad(&["plot", a2a.to_str().unwrap()], "--output");
    assert!(!svg.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--compare` with oxccl's own libnccl.so (host buffers): the path of the
/// library next to this build's `oxccl`, built first when missing.
fn own_libnccl() -> PathBuf {
    let bin = Path::new(BIN);
    let dir = bin.parent().unwrap();
    let lib = dir.join("libnccl.so");
    if !lib.exists() {
        let target = dir.parent().unwrap();
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-p", "oxccl-nccl"])
            .env("CARGO_TARGET_DIR", target)
            .stdin(Stdio::null());
        if dir.file_name().unwrap() == "release" {
            c.arg("--release");
        }
        let out = c.output().expect("run cargo");
        assert!(
            out.status.success(),
            "cargo build -p oxccl-nccl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(lib.exists(), "{} missing after the build", lib.display());
    lib
}

#[test]
fn compare_with_own_libnccl_end_to_end() {
    let lib = own_libnccl();
    let dir = tmpdir("cmp");
    let json = dir.join("cmp.json");
    let out = oxccl(&[
        "perf",
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "16",
        "-n",
        "2",
        "-w",
        "1",
        "--compare",
        lib.to_str().unwrap(),
        "-J",
        json.to_str().unwrap(),
    ]);
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("compare: libnccl.so 2."), "{stdout}");
    assert!(stdout.contains("ratio"), "{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for r in &rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(f.len(), 17, "{r}");
        assert_eq!(f[15], "0", "compared library's #wrong: {r}");
        let ratio: f64 = f[16].parse().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{r}");
    }
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(doc["oxccl"]["compare"]["library"]
        .as_str()
        .unwrap()
        .starts_with("libnccl.so 2."));
    for r in doc["results"].as_array().unwrap() {
        let c = &r["compare"];
        assert!(c["time_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(c["ratio"].as_f64().unwrap().is_finite(), "{r}");
        assert_eq!(c["nwrong"], 0);
    }
    // The plot shows both libraries.
    let svg = dir.join("cmp.svg");
    let out = oxccl(&["plot", json.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    ok(&out);
    let elems = parse_xml(&std::fs::read_to_string(&svg).unwrap()).unwrap();
    let s = series_of(&elems, "busbw");
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(
        s[0].starts_with("oxccl ") && s[1].starts_with("libnccl.so 2."),
        "{s:?}"
    );

    // Thread ranks and a collective in a group (sendrecv) too.
    let out = oxccl(&[
        "perf",
        "sendrecv",
        "--ranks",
        "2",
        "--launch",
        "thread",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "2",
        "-w",
        "1",
        "--compare",
        lib.to_str().unwrap(),
    ]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ratio"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_refuses_what_is_no_nccl_library() {
    let dir = tmpdir("cmpbad");
    let notlib = dir.join("libnccl.so.2");
    std::fs::write(&notlib, "not an ELF file").unwrap();
    for (path, want) in [
        (notlib.to_str().unwrap(), "cannot be loaded"),
        ("/nonexistent/libnccl.so.2", "no such file"),
    ] {
        let out = oxccl(&[
            "perf",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "8",
            "--compare",
            path,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("oxccl perf: --compare "), "{err}");
        assert!(err.contains(want) && err.contains("accepted:"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_lists_plot() {
    let out = oxccl(&["--help"]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("plot"));
}

/// The progress bar is drawn only when stderr is a terminal: none through a
/// pipe; under `script` (a pseudo-terminal), present and cleared at the end.
#[test]
fn progress_bar_only_on_a_terminal() {
    let args = [
        "perf",
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "1K",
        "-f",
        "4",
        "-n",
        "1",
        "-w",
        "0",
    ];
    let out = oxccl(&args);
    ok(&out);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = Path::new("/usr/bin/script");
    assert!(
        script.exists(),
        "the terminal half needs /usr/bin/script (util-linux) to give the command a terminal"
    );
    let dir = tmpdir("tty");
    let log = dir.join("tty.log");
    let cmd = format!("{BIN} {} >/dev/null", args.join(" "));
    let out = Command::new(script)
        .args(["-qec", &cmd, log.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    ok(&out);
    let t = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(t.contains("oxccl perf [") && t.contains("4/4 cases"), "{t}");
    let last = t.rfind("4/4 cases").unwrap();
    assert!(t[last..].contains("\r\x1b[K"), "bar not cleared: {t}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file in nccl-tests' own `-J` layout (no `oxccl` section: the collective
/// from the command line, the library from `nccl_version`) and an older oxccl
/// file from docs/runs both plot, and plot says what it wrote.
#[test]
fn reads_nccl_tests_layout_and_older_files_and_reports() {
    let d = tmpdir("layouts");
    let nccl = d.join("nccl.json");
    let doc = serde_json::json!({
        "version": 3,
        "start_time": "2026-01-01 00:00:00",
        "args": ["./build/all_gather_perf", "-b", "8", "-e", "16", "-f", "2"],
        "env": [],
        "nccl_version": 22807,
        "config": {"nthreads": 1, "ngpus": 2, "minimum_bytes": 8, "maximum_bytes": 16,
                   "devices": [{"rank": 0, "hostname": "node-a"}, {"rank": 1, "hostname": "node-a"}]},
        "results": [
            {"size": 8, "count": 1, "type": "float", "redop": "none", "root": "    -1",
             "out_of_place": {"time": 10.5, "alg_bw": 0.0, "bus_bw": 0.01, "nwrong": 0},
             "in_place": {"time": 10.0, "alg_bw": 0.0, "bus_bw": 0.01, "nwrong": 0}},
            {"size": 16, "count": 2, "type": "float", "redop": "none", "root": "    -1",
             "out_of_place": {"time": 11.5, "alg_bw": 0.0, "bus_bw": 0.02, "nwrong": 0},
             "in_place": {"time": 11.0, "alg_bw": 0.0, "bus_bw": 0.02, "nwrong": 0}}
        ]
    });
    std::fs::write(&nccl, doc.to_string()).unwrap();
    let svg = d.join("nccl.svg");
    let out = oxccl(&["plot", nccl.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    ok(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("wrote {} (1 series, 2 points)", svg.display())
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("NCCL 2.28.7 all_gather float, 2 ranks, node-a"),
        "{text}"
    );
    let old = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/runs/gpu-all_reduce-ranks2-vs-nccl-2xh200.json");
    let svg2 = d.join("old.svg");
    let out = oxccl(&["plot", old.to_str().unwrap(), "-o", svg2.to_str().unwrap()]);
    ok(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!("wrote {} (2 series, ", svg2.display())),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
