//! `docs/compatibility.md` is generated, and checked, from:
//! - `nccl-2.30-exports.txt`: the functions NCCL 2.30.7 exports (facts);
//! - `exports.txt`: what `libnccl.so` exports (`tests/abi.rs` holds the
//!   library to it) and [`nccl::REFUSED`], the exported functions that refuse
//!   every call;
//! - `torch-imports/*.txt`: the NCCL functions PyTorch wheels import;
//! - `../oxccl-core/nccl-documented-vars.txt`: the variables NCCL's user guide
//!   documents, joined with the parameter registry (`oxccl_core::params`).
//!
//! The tests fail when the file is stale, when it lacks an NCCL export or a
//! documented variable, when a status it states disagrees with `exports.txt`
//! or the registry, and when a function it calls refused returns anything but
//! the code and text it documents. Regenerate with
//! `OXCCL_BLESS=1 cargo test -p oxccl-nccl --test compat_doc`.

mod common;

use common::{last, ok};
use nccl::abi::*;
use nccl::*;
use oxccl_core::params;
use std::collections::BTreeSet;
use std::ptr::{null, null_mut};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/compatibility.md");
const NCCL_EXPORTS: &str = include_str!("../nccl-2.30-exports.txt");
const OUR_EXPORTS: &str = include_str!("../exports.txt");
const DOCUMENTED_VARS: &str = include_str!("../../oxccl-core/nccl-documented-vars.txt");
const TORCH_IMPORTS: &[(&str, &str)] = &[
    ("2.9.1", include_str!("../torch-imports/torch-2.9.1.txt")),
    ("2.11.0", include_str!("../torch-imports/torch-2.11.0.txt")),
    ("2.15.0", include_str!("../torch-imports/torch-2.15.0.txt")),
];

/// Headings of the two tables (the checks find the tables by them).
const FUNCTIONS_HEADING: &str = "## Functions";
const VARIABLES_HEADING: &str = "## Environment variables";

/// The lines of a data file that are names (not blank, not `#` comments).
fn names(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// NCCL's name of a result code (`nccl.h`).
fn result_name(code: ncclResult_t) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown",
    }
}

/// A function name without its profiling `p` (`pncclX` → `ncclX`).
fn base(name: &str) -> &str {
    name.strip_prefix('p')
        .filter(|b| b.starts_with("nccl"))
        .unwrap_or(name)
}

/// Why NCCL exports a function oxccl does not: the families of NCCL 2.30's
/// newer API (by name prefix) and its internal symbols.
fn absent_note(name: &str) -> &'static str {
    const FAMILIES: &[(&str, &str)] = &[
        (
            "ncclParam",
            "NCCL 2.30's parameter API; oxccl's parameters are in [env.md](env.md)",
        ),
        (
            "ncclGin",
            "device API: GPU-initiated networking requirements",
        ),
        ("ncclLsaBarrier", "device API: LSA barrier requirements"),
        ("ncclLLA2A", "device API: LL all-to-all requirements"),
        ("ncclGetMultimem", "NVLink SHARP (multimem) pointers"),
        ("ncclResetDebugInitInternal", "NCCL-internal symbol"),
    ];
    FAMILIES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or("", |(_, note)| note)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FnStatus {
    Works,
    Refused,
    Absent,
}

impl FnStatus {
    fn word(self) -> &'static str {
        match self {
            FnStatus::Works => "works",
            FnStatus::Refused => "refused",
            FnStatus::Absent => "absent",
        }
    }

    fn parse(word: &str) -> Option<FnStatus> {
        [FnStatus::Works, FnStatus::Refused, FnStatus::Absent]
            .into_iter()
            .find(|s| s.word() == word)
    }
}

/// One row of the function table: `ncclX` and the twins NCCL exports with it.
struct FnRow {
    nccl_names: Vec<String>,
    status: FnStatus,
    note: String,
}

fn function_rows() -> Vec<FnRow> {
    let nccl = names(NCCL_EXPORTS);
    let ours = names(OUR_EXPORTS);
    let bases: BTreeSet<&str> = nccl.iter().map(|n| base(n)).collect();
    bases
        .into_iter()
        .map(|b| {
            let nccl_names: Vec<String> = [b.to_string(), format!("p{b}")]
                .into_iter()
                .filter(|n| nccl.contains(&n.as_str()))
                .collect();
            let refusal = REFUSED.iter().find(|r| r.name == b);
            let (status, note) = if !ours.contains(&b) {
                (FnStatus::Absent, absent_note(b).to_string())
            } else if let Some(r) = refusal {
                (
                    FnStatus::Refused,
                    format!(
                        "`{}` ({}): \"{}\"",
                        result_name(r.result),
                        r.result,
                        r.message
                    ),
                )
            } else {
                (FnStatus::Works, String::new())
            };
            FnRow {
                nccl_names,
                status,
                note,
            }
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum VarStatus {
    Honoured,
    Ignored,
    Unknown,
}

impl VarStatus {
    fn of(name: &str) -> VarStatus {
        match params::lookup(name) {
            Some(p) if p.honoured => VarStatus::Honoured,
            Some(_) => VarStatus::Ignored,
            None => VarStatus::Unknown,
        }
    }

    fn words(self) -> &'static str {
        match self {
            VarStatus::Honoured => "honoured",
            VarStatus::Ignored => "accepted and ignored",
            VarStatus::Unknown => "unknown",
        }
    }
}

/// The documented variables with the section of NCCL's page each is in.
fn documented_vars() -> Vec<(&'static str, &'static str)> {
    let mut section = "";
    let mut out = Vec::new();
    for line in DOCUMENTED_VARS.lines().map(str::trim) {
        if let Some(s) = line.strip_prefix("## ") {
            section = s;
        } else if !line.is_empty() && !line.starts_with('#') {
            out.push((line, section));
        }
    }
    out
}

/// `ncclGetVersion` through the library, as "2.27.5 (`NCCL_VERSION_CODE` 22705)".
fn reported_version() -> String {
    let mut code = 0;
    // SAFETY: a writable int.
    ok(unsafe { ncclGetVersion(&mut code) }, "ncclGetVersion");
    // NCCL_VERSION(X, Y, Z) = X*10000 + Y*100 + Z from 2.9 on.
    format!(
        "{}.{}.{} (`NCCL_VERSION_CODE` {code})",
        code / 10000,
        code % 10000 / 100,
        code % 100
    )
}

/// A sentence on which PyTorch wheels find every NCCL function they import.
fn torch_sentence() -> String {
    let ours = names(OUR_EXPORTS);
    let mut complete = Vec::new();
    let mut lacking = Vec::new();
    for (version, text) in TORCH_IMPORTS {
        let missing: Vec<&str> = names(text)
            .into_iter()
            .filter(|n| !ours.contains(n))
            .collect();
        if missing.is_empty() {
            complete.push(format!("{version} ({} functions)", names(text).len()));
        } else {
            lacking.push(format!("{version} lacks `{}`", missing.join("`, `")));
        }
    }
    let mut s = String::new();
    if !complete.is_empty() {
        s.push_str(&format!(
            "Every NCCL function that PyTorch's `libtorch_cuda.so` imports is exported, for the \
             PyPI wheels of torch {}.",
            complete.join(", ")
        ));
    }
    if !lacking.is_empty() {
        s.push_str(&format!(
            " Not complete for every wheel checked: {}.",
            lacking.join("; ")
        ));
    }
    s.trim().to_string()
}

/// The whole of `docs/compatibility.md`.
fn markdown() -> String {
    let rows = function_rows();
    let count = |s: FnStatus| rows.iter().filter(|r| r.status == s).count();
    let vars = documented_vars();
    let var_count = |s: VarStatus| vars.iter().filter(|(n, _)| VarStatus::of(n) == s).count();
    let documented: BTreeSet<&str> = vars.iter().map(|(n, _)| *n).collect();
    let undocumented: Vec<String> = params::ALL
        .iter()
        .filter(|p| p.name.starts_with("NCCL_") && !documented.contains(p.name))
        .map(|p| format!("`{}`", p.name))
        .collect();
    let extra: Vec<String> = names(OUR_EXPORTS)
        .into_iter()
        .filter(|n| !names(NCCL_EXPORTS).contains(n))
        .map(|n| format!("`{n}`"))
        .collect();

    let mut out = String::new();
    out.push_str("# Compatibility with NCCL 2.30\n\n");
    out.push_str(
        "<!-- Generated by `OXCCL_BLESS=1 cargo test -p oxccl-nccl --test compat_doc` from \
         crates/oxccl-nccl/nccl-2.30-exports.txt, crates/oxccl-nccl/exports.txt, \
         crates/oxccl-nccl/src/lib.rs (`REFUSED`), crates/oxccl-nccl/torch-imports/ and \
         crates/oxccl-core/nccl-documented-vars.txt with the parameter registry; \
         do not edit by hand. -->\n\n",
    );
    out.push_str(
        "oxccl's `libnccl.so.2` stands in for NCCL's: a program built against NCCL loads it \
         unchanged. This page lists, for every function NCCL 2.30.7 exports, whether oxccl \
         implements it, refuses it or lacks it, and, for every `NCCL_*` variable NCCL's user \
         guide documents, whether oxccl acts on it.\n\n",
    );
    out.push_str(&format!(
        "- **Version.** `ncclGetVersion` reports {}, and `include/nccl.h` claims the same: \
         programs that test the version at run time see that number. Its `ncclConfig_t` is \
         2.27's; the library also accepts the longer configs of newer headers. The functions \
         NCCL added after 2.27 are exported or not as the table below says.\n",
        reported_version()
    ));
    out.push_str(&format!("- **PyTorch.** {}\n", torch_sentence()));
    out.push_str(
        "- **How to check a machine.** `oxccl doctor` ([doctor.md](doctor.md)) reports each \
         `NCCL_*`/`OXCCL_*` variable set that oxccl does not know (⚠ `env.NAME`, with the \
         nearest known name) and each malformed value of a known one (✘); \
         `oxccl doctor --program ./train` says which `libnccl.so.2` that program loads and by \
         which rule, and its `torch` check says whether PyTorch's `libtorch_cuda.so` resolved \
         to oxccl's library. `nm -D --defined-only libnccl.so.2` lists what a library exports.\n\n",
    );

    out.push_str(&format!("{FUNCTIONS_HEADING}\n\n"));
    out.push_str(&format!(
        "{} functions (each `ncclX` with its profiling twin `pncclX`, which behaves the same): \
         {} work, {} are refused, {} are absent.\n\n",
        rows.len(),
        count(FnStatus::Works),
        count(FnStatus::Refused),
        count(FnStatus::Absent)
    ));
    out.push_str(
        "- **works**: implemented; what runs where (host buffers, device buffers, which \
         layouts) is in [c-abi.md](c-abi.md) and [gpu.md](gpu.md).\n\
         - **refused**: exported, so programs that link it load and run, but every call \
         returns the code shown, logs the text as a WARN line and makes it \
         `ncclGetLastError`'s text.\n\
         - **absent**: not exported: a program linked against it fails to load \
         (`undefined symbol`), and `dlsym` returns NULL.\n\n",
    );
    out.push_str("| function | status | returns / notes |\n| --- | --- | --- |\n");
    for r in &rows {
        let cell: Vec<String> = r.nccl_names.iter().map(|n| format!("`{n}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            cell.join(", "),
            r.status.word(),
            r.note
        ));
    }
    if !extra.is_empty() {
        out.push_str(&format!(
            "\noxccl also exports, beyond NCCL 2.30: {}.\n",
            extra.join(", ")
        ));
    }
    out.push('\n');

    out.push_str(&format!("{VARIABLES_HEADING}\n\n"));
    out.push_str(&format!(
        "{} variables documented by NCCL: {} honoured, {} accepted and ignored, {} unknown.\n\n",
        vars.len(),
        var_count(VarStatus::Honoured),
        var_count(VarStatus::Ignored),
        var_count(VarStatus::Unknown)
    ));
    out.push_str(
        "- **honoured**: oxccl acts on it; its meaning, type and default in oxccl are in \
         [env.md](env.md).\n\
         - **accepted and ignored**: known to oxccl, so setting it raises no warning, and its \
         value is checked against NCCL's form, but it changes nothing.\n\
         - **unknown**: oxccl does not read it; `NCCL_DEBUG=WARN` and `oxccl doctor` report it \
         as an unknown variable.\n\n",
    );
    out.push_str("| variable | NCCL's section | oxccl |\n| --- | --- | --- |\n");
    for (name, section) in &vars {
        out.push_str(&format!(
            "| `{name}` | {section} | {} |\n",
            VarStatus::of(name).words()
        ));
    }
    if !undocumented.is_empty() {
        out.push_str(&format!(
            "\noxccl also knows `NCCL_*` variables that NCCL's guide does not document: {}; \
             and it has `OXCCL_*` variables of its own. [env.md](env.md) lists them all, \
             honoured or not.\n",
            undocumented.join(", ")
        ));
    }
    out
}

// ---- reading the committed file back --------------------------------------------

/// The committed file (while blessing, the text being written: the tests run in parallel).
fn committed_doc() -> String {
    if std::env::var_os("OXCCL_BLESS").is_some() {
        return markdown();
    }
    std::fs::read_to_string(DOC).unwrap_or_else(|e| {
        panic!(
            "{DOC}: {e}; generate it with `OXCCL_BLESS=1 cargo test -p oxccl-nccl --test compat_doc`"
        )
    })
}

/// The cells of the table rows under `heading` (up to the next `## `).
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(&format!("{heading}\n"))
        .unwrap_or_else(|| panic!("no `{heading}` section"));
    doc[start + heading.len()..]
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The names in backticks of a cell.
fn ticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Function rows of the committed file: (names, status, notes).
fn doc_function_rows() -> Vec<(Vec<String>, FnStatus, String)> {
    table(&committed_doc(), FUNCTIONS_HEADING)
        .into_iter()
        .map(|cells| {
            assert_eq!(cells.len(), 3, "function row {cells:?}");
            let status = FnStatus::parse(&cells[1])
                .unwrap_or_else(|| panic!("status of {cells:?} is not works/refused/absent"));
            let names = ticked(&cells[0]).into_iter().map(String::from).collect();
            (names, status, cells[2].clone())
        })
        .collect()
}

#[test]
fn compatibility_md_is_fresh() {
    let want = markdown();
    if std::env::var_os("OXCCL_BLESS").is_some() {
        std::fs::write(DOC, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(DOC).unwrap_or_default();
    assert!(
        have == want,
        "docs/compatibility.md is stale: run `OXCCL_BLESS=1 cargo test -p oxccl-nccl --test compat_doc`"
    );
}

#[test]
fn the_doc_lists_every_nccl_export() {
    let listed: BTreeSet<String> = doc_function_rows()
        .into_iter()
        .flat_map(|(names, _, _)| names)
        .collect();
    let missing: Vec<&str> = names(NCCL_EXPORTS)
        .into_iter()
        .filter(|n| !listed.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "NCCL exports missing from docs/compatibility.md: {missing:?}"
    );
}

#[test]
fn the_doc_agrees_with_exports_txt() {
    let ours = names(OUR_EXPORTS);
    for (names, status, _) in doc_function_rows() {
        for n in &names {
            let exported = ours.contains(&n.as_str());
            match status {
                FnStatus::Works | FnStatus::Refused => {
                    assert!(
                        exported,
                        "docs/compatibility.md calls {n} {status:?}, but exports.txt lacks it"
                    )
                }
                FnStatus::Absent => {
                    assert!(
                        !exported,
                        "docs/compatibility.md calls {n} absent, but exports.txt has it"
                    )
                }
            }
        }
    }
    // Every refusal of the code is in exports.txt too (else it could not be called).
    for r in REFUSED {
        assert!(
            ours.contains(&r.name),
            "{} refuses but is not exported",
            r.name
        );
    }
}

/// Calls the refused function `name` and its `p` twin with NULL arguments
/// (a refusal looks at none); None for a name this test has no call for.
fn call_refused(name: &str) -> Option<[ncclResult_t; 2]> {
    let (c, w) = (null_mut::<ncclComm>(), null_mut::<ncclWindow_vidmem>());
    // SAFETY: refused calls read none of their arguments.
    let r = unsafe {
        match name {
            "ncclCommSuspend" => [ncclCommSuspend(c, 0), pncclCommSuspend(c, 0)],
            "ncclCommResume" => [ncclCommResume(c), pncclCommResume(c)],
            "ncclCommMemStats" => [
                ncclCommMemStats(c, 0, null_mut()),
                pncclCommMemStats(c, 0, null_mut()),
            ],
            "ncclPutSignal" => [
                ncclPutSignal(null(), 1, 0, 1, w, 0, 0, 0, 0, c, null_mut()),
                pncclPutSignal(null(), 1, 0, 1, w, 0, 0, 0, 0, c, null_mut()),
            ],
            "ncclSignal" => [
                ncclSignal(1, 0, 0, 0, c, null_mut()),
                pncclSignal(1, 0, 0, 0, c, null_mut()),
            ],
            "ncclWaitSignal" => [
                ncclWaitSignal(0, null_mut(), c, null_mut()),
                pncclWaitSignal(0, null_mut(), c, null_mut()),
            ],
            "ncclCommQueryProperties" => [
                ncclCommQueryProperties(c, null_mut()),
                pncclCommQueryProperties(c, null_mut()),
            ],
            "ncclDevCommCreate" => [
                ncclDevCommCreate(c, null(), null_mut()),
                pncclDevCommCreate(c, null(), null_mut()),
            ],
            "ncclDevCommDestroy" => [
                ncclDevCommDestroy(c, null()),
                pncclDevCommDestroy(c, null()),
            ],
            "ncclGetLsaMultimemDevicePointer" => [
                ncclGetLsaMultimemDevicePointer(w, 0, null_mut()),
                pncclGetLsaMultimemDevicePointer(w, 0, null_mut()),
            ],
            _ => return None,
        }
    };
    Some(r)
}

#[test]
fn refused_functions_return_the_documented_code_and_text() {
    let refused: Vec<_> = doc_function_rows()
        .into_iter()
        .filter(|(_, s, _)| *s == FnStatus::Refused)
        .collect();
    assert!(!refused.is_empty(), "no refused function documented");
    for (names, _, note) in refused {
        // The note reads: `ncclInvalidUsage` (5): "text".
        let code: ncclResult_t = note
            .split(['(', ')'])
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no (code) in the note of {names:?}: {note}"));
        let text = note
            .split('"')
            .nth(1)
            .unwrap_or_else(|| panic!("no \"text\" in the note of {names:?}: {note}"));
        let name = &names[0];
        let got = call_refused(name)
            .unwrap_or_else(|| panic!("no call for {name} in call_refused: add one"));
        assert_eq!(got, [code, code], "{name} / p{name}: documented {note}");
        let logged = last(null_mut());
        assert!(
            logged.contains(text),
            "{name}: last error {logged:?}, documented {text:?}"
        );
    }
}

#[test]
fn the_doc_lists_every_documented_variable_with_the_registry_status() {
    let rows = table(&committed_doc(), VARIABLES_HEADING);
    for (name, _) in documented_vars() {
        let row = rows
            .iter()
            .find(|cells| ticked(&cells[0]) == [name])
            .unwrap_or_else(|| panic!("{name} is missing from docs/compatibility.md"));
        let want = VarStatus::of(name).words();
        assert_eq!(row.last().map(String::as_str), Some(want), "{name}");
    }
}

#[test]
fn data_files_are_well_formed() {
    let nccl = names(NCCL_EXPORTS);
    assert!(nccl.contains(&"ncclAllReduce") && nccl.contains(&"pncclAllReduce"));
    let vars = documented_vars();
    assert!(vars
        .iter()
        .all(|(n, s)| n.starts_with("NCCL_") && !s.is_empty()));
    let unique: BTreeSet<&str> = vars.iter().map(|(n, _)| *n).collect();
    assert_eq!(unique.len(), vars.len(), "a variable listed twice");
}
