//! `oxccl`: the command-line tool of oxccl.
//!
//! `oxccl perf <collective>` benchmarks and checks collectives with
//! nccl-tests' flags and table (see [`perf`]); `oxccl plot` draws its JSON
//! (or nccl-tests' text output) as an SVG (see [`plot`]); `oxccl doctor`
//! checks the machine and says how to fix what is wrong (see [`doctor`]);
//! `oxccl topo` prints the machine's topology and the plan on it (see [`topo`]);
//! `oxccl kernels` prebuilds the GPU kernels for packaging (see [`kernels`]);
//! `oxccl run -- CMD` starts a job with oxccl's library preloaded (see [`run`]).

mod child;
mod doctor;
mod kernels;
mod libpath;
mod perf;
mod plot;
mod run;
mod system;
mod topo;

use clap::{Parser, Subcommand};

/// A command-line mistake: reported on one line, exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

#[derive(Parser)]
#[command(
    name = "oxccl",
    version,
    about = "oxccl: collective communication with NCCL's semantics, in Rust",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmark and check a collective: nccl-tests' flags and table
    // nccl-tests' -V is --device_cta_count: no -V/--version here.
    #[command(disable_version_flag = true)]
    Perf(Box<perf::PerfArgs>),
    /// Plot bus bandwidth and time against size from `oxccl perf -J` or nccl-tests output, as SVG
    Plot(plot::PlotArgs),
    /// Find what is wrong with this machine for collective communication, and how to fix it
    Doctor(doctor::DoctorArgs),
    /// Print the machine's topology as a tree and a matrix, with the rings and trees planned on it; dump or read it as XML
    Topo(topo::TopoArgs),
    /// Compile every GPU kernel into a folder to ship beside libnccl.so.2 (first starts then compile nothing)
    Kernels(kernels::KernelsArgs),
    /// Run a command (torchrun, srun, python...) with oxccl's libnccl.so.2 preloaded for it and its children
    Run(run::RunArgs),
}

/// Clap's error on one line: its message lines up to the usage, joined.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts: Vec<&str> = Vec::new();
    for l in text.lines() {
        let l = l.trim();
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if l.is_empty() || l.starts_with("tip:") {
            continue;
        }
        parts.push(l.strip_prefix("error: ").unwrap_or(l));
    }
    parts.join(" ")
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => e.exit(),
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    std::process::exit(2);
                }
                _ => {
                    let sub = match std::env::args().nth(1).as_deref() {
                        Some("perf") => "oxccl perf --help",
                        Some("plot") => "oxccl plot --help",
                        Some("doctor") => "oxccl doctor --help",
                        Some("topo") => "oxccl topo --help",
                        Some("kernels") => "oxccl kernels --help",
                        Some("run") => "oxccl run --help",
                        _ => "oxccl --help",
                    };
                    eprintln!("oxccl: {} (see '{sub}')", one_line(&e));
                    std::process::exit(2);
                }
            }
        }
    };
    let code = match cli.cmd {
        Cmd::Perf(a) => perf::main(&a),
        Cmd::Plot(a) => plot::main(&a),
        Cmd::Doctor(a) => doctor::main(&a),
        Cmd::Topo(a) => topo::main(&a),
        Cmd::Kernels(a) => kernels::main(&a),
        Cmd::Run(a) => run::main(&a),
    };
    std::process::exit(code);
}
