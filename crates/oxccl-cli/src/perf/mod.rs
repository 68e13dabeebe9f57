//! `oxccl perf`: nccl-tests' benchmarks and correctness checks on oxccl.
//!
//! The flags keep nccl-tests' letters and meanings, and the table keeps its
//! layout, so a run of `oxccl perf all_reduce -b 8 -e 128M -f 2` lines up with
//! one of `all_reduce_perf -b 8 -e 128M -f 2`. Ranks are local processes
//! (default), threads, or the processes of an external launcher (torchrun,
//! Slurm, Open MPI); see [`launch`].
//!
//! Two backends: `cpu` runs oxccl's Rust API on host memory ([`mod@bench`]);
//! `cuda` runs an NCCL-API library (oxccl's `libnccl.so` by default) on
//! device memory, one GPU per rank, `-g` GPUs per thread ([`gpu`]).

pub mod bench;
pub mod coll;
pub mod common;
pub mod compare;
pub mod data;
pub mod fmt;
pub mod gpu;
pub mod launch;
pub mod memory;
pub mod progress;
pub mod stats;

use crate::UsageError;
use clap::{Args, ValueEnum};
use coll::Coll;
use oxccl::{DataType, RedOp};
use std::path::PathBuf;
use std::time::Duration;

/// Where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LaunchKind {
    /// One child process per `-t` ranks, over shared memory.
    Process,
    /// Every rank a thread of this process.
    Thread,
}

/// Which executor runs the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Host memory, through oxccl's Rust API.
    Cpu,
    /// GPU memory, through an NCCL-API library (oxccl's libnccl.so, or --lib).
    Cuda,
    /// cuda when a GPU is usable (and oxccl's libnccl.so is found), else cpu.
    Auto,
}

/// A list of reduction ops (`-o`).
#[derive(Clone, Debug)]
pub struct OpList(pub Vec<RedOp>);
/// A list of data types (`-d`).
#[derive(Clone, Debug)]
pub struct TypeList(pub Vec<DataType>);

const OP_NAMES: &str = "sum, prod, max, min, avg or all";
const TYPE_NAMES: &str = "int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2 or all";

fn parse_ops(s: &str) -> Result<OpList, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(OpList(RedOp::BUILTIN.to_vec()));
    }
    s.split(',')
        .map(|t| {
            RedOp::parse(t.trim()).map_err(|_| format!("unknown op '{t}' (accepted: {OP_NAMES})"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(OpList)
}

fn parse_types(s: &str) -> Result<TypeList, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(TypeList(DataType::ALL.to_vec()));
    }
    s.split(',')
        .map(|t| {
            DataType::parse(t.trim())
                .map_err(|_| format!("unknown data type '{t}' (accepted: {TYPE_NAMES})"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(TypeList)
}

fn at_least_one(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("'{s}' is not a whole number of 1 or more")),
    }
}

/// What `-b`, `-e` and `-i` accept, for messages.
pub const SIZE_ACCEPTED: &str =
    "a size must be a non-negative number of bytes, optionally with K, M or G (KiB, MiB, GiB; e.g. 8, 64K, 1.5M, 2G)";

/// A byte count as nccl-tests reads it: a non-negative number (a fraction
/// is allowed and rounded down) with an optional K, M or G suffix (KiB, MiB,
/// GiB; `B` or `iB` may follow).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || SIZE_ACCEPTED.to_string();
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix(['B', 'b']))
        .unwrap_or(t);
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some(_) => (t, 1),
        None => return Err(bad()),
    };
    if !num.chars().all(|c| c.is_ascii_digit() || c == '.') || num.is_empty() {
        return Err(bad());
    }
    if let Ok(v) = num.parse::<u64>() {
        return v.checked_mul(mul).ok_or_else(bad);
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * mul as f64;
    // 2^64 bytes and above do not fit a u64.
    if !bytes.is_finite() || bytes >= 18_446_744_073_709_551_616.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// `-b`, `-e` or `-i` read, or the message naming the flag.
fn size_flag(flag: &str, value: &str) -> Result<u64, UsageError> {
    parse_size(value).map_err(|why| UsageError(format!("{flag} {value}: {why}")))
}

/// `-r`: one root rank, or every rank in turn (`all`, or nccl-tests' `-1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootSel {
    One(usize),
    All,
}

/// Reads `-r`.
pub fn parse_root(s: &str) -> Result<RootSel, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("all") || t == "-1" {
        return Ok(RootSel::All);
    }
    t.parse::<usize>()
        .map(RootSel::One)
        .map_err(|_| "a root must be a rank number, or all (or -1) for every rank in turn".into())
}

/// `oxccl perf` flags: nccl-tests' letters and meanings, plus oxccl's launch options.
#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Sizes go from -b to -e, multiplied by -f when it is above 1, else increased by -i.
Each size runs -w warm-up iterations, then -n timed iterations of -m operations
(-m operations form one group for all_reduce and sendrecv, and run one after
another for the other collectives), then -c checked iterations. Only rank 0
prints. alltoall and sendrecv have no in-place form: their in-place columns
print N/A. Exit status: 0 ok, 2 bad arguments, 7 wrong results, 1 any other failure.

Ranks: --ranks local ranks as child processes (-t ranks per process as threads)
or as threads of this process (--launch thread). Under torchrun (RANK,
WORLD_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS) or Open MPI
(OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE) each process is -t ranks of that
world and meets the others through NCCL_COMM_ID, else MASTER_ADDR:MASTER_PORT
(port + 1 when TORCHELASTIC_USE_AGENT_STORE=True: torchrun's store holds the port).")]
pub struct PerfArgs {
    /// all_reduce, all_gather, broadcast, reduce, reduce_scatter, alltoall, gather, scatter or sendrecv (also nccl-tests' names: all_reduce_perf, allreduce)
    #[arg(value_name = "COLLECTIVE")]
    pub collective: String,
    /// Smallest size in bytes (K, M, G suffixes: KiB, MiB, GiB)
    #[arg(
        short = 'b',
        long = "minbytes",
        value_name = "BYTES",
        default_value = "32M",
        allow_hyphen_values = true
    )]
    pub minbytes: String,
    /// Largest size in bytes
    #[arg(
        short = 'e',
        long = "maxbytes",
        value_name = "BYTES",
        default_value = "32M",
        allow_hyphen_values = true
    )]
    pub maxbytes: String,
    /// Size increment when -f is 1
    #[arg(
        short = 'i',
        long = "stepbytes",
        value_name = "BYTES",
        default_value = "1M",
        allow_hyphen_values = true
    )]
    pub stepbytes: String,
    /// Size multiplier (1: add -i instead)
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "N",
        default_value_t = 1
    )]
    pub stepfactor: u64,
    /// Timed iterations per size
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 20,
          value_parser = at_least_one)]
    pub iters: u64,
    /// Warm-up iterations per size
    #[arg(
        short = 'w',
        long = "warmup_iters",
        visible_alias = "warmup-iters",
        value_name = "N",
        default_value_t = 1
    )]
    pub warmup_iters: u64,
    /// Operations per iteration (one group for all_reduce and sendrecv, else sequential)
    #[arg(short = 'm', long = "agg_iters", visible_alias = "agg-iters", value_name = "N", default_value_t = 1,
          value_parser = at_least_one)]
    pub agg_iters: u64,
    /// Checked iterations per size (0: no check, #wrong prints N/A)
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1)]
    pub check: u64,
    /// Reduction op: sum, prod, max, min, avg, or all
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum", value_parser = parse_ops)]
    pub op: OpList,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2, or all
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", default_value = "float", value_parser = parse_types)]
    pub datatype: TypeList,
    /// Root rank of broadcast, reduce, gather and scatter; `all` (or -1): every rank in turn
    #[arg(
        short = 'r',
        long = "root",
        value_name = "RANK|all",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub root: String,
    /// Ranks per process, as threads
    #[arg(short = 't', long = "nthreads", value_name = "N", default_value_t = 1,
          value_parser = at_least_one)]
    pub nthreads: u64,
    /// GPUs per thread (CUDA backend): one thread drives N GPUs, one rank each
    #[arg(short = 'g', long = "ngpus", value_name = "N", default_value_t = 1,
          value_parser = at_least_one)]
    pub ngpus: u64,
    /// CUDA graph replays (CUDA backend): capture the -n iterations in a graph and time N replays
    #[arg(short = 'G', long = "cudagraph", value_name = "N", default_value_t = 0)]
    pub cudagraph: u64,
    /// Blocking collectives: wait for each call to complete (CUDA backend; host operations always block)
    #[arg(short = 'z', long = "blocking", value_name = "0-3", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub blocking: u8,
    /// Per-rank times combined as 0 rank 0's, 1 the average, 2 the minimum, 3 the maximum
    #[arg(short = 'a', long = "average", value_name = "0-3", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
    /// Seconds an operation may take before the communicators are aborted (0: library default)
    #[arg(
        short = 'T',
        long = "timeout",
        value_name = "SECONDS",
        default_value_t = 0
    )]
    pub timeout: u64,
    /// Write the configuration and every result line as JSON to this file
    #[arg(
        short = 'J',
        long = "output_file",
        visible_alias = "output-file",
        value_name = "PATH"
    )]
    pub output_file: Option<PathBuf>,
    /// Repeat the whole sweep N times, printing each (0: until interrupted)
    #[arg(
        short = 'N',
        long = "run_cycles",
        value_name = "N",
        default_value_t = 1
    )]
    pub run_cycles: u64,
    /// 1: the ranks create their communicators concurrently (oxccl's ranks always do; the header says so)
    #[arg(short = 'p', long = "parallel_init", value_name = "0/1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub parallel_init: u8,
    /// 1: report the host time to issue the calls ("cputime") instead of the time to complete them
    #[arg(short = 'C', long = "report_cputime", value_name = "0/1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub report_cputime: u8,
    /// 1: end each table line with the local time (%Y-%m-%d %H:%M:%S)
    #[arg(short = 'S', long = "report_timestamps", value_name = "0/1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub report_timestamps: u8,
    /// Register the send and receive buffers: 0 no, 1 local (ncclCommRegister), 2 symmetric (ncclCommWindowRegister)
    #[arg(short = 'R', long = "local_register", value_name = "0/1/2", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=2))]
    pub local_register: u8,
    /// CTA policy of the communicators (0 default, 1 efficiency, 2 zero) [default: not set]
    #[arg(
        short = 'x',
        long = "cta_policy",
        value_name = "0/1/2",
        allow_hyphen_values = true
    )]
    pub cta_policy: Option<i64>,
    /// Device-API implementation of the collective (0: the host API)
    #[arg(
        short = 'D',
        long = "device_implementation",
        value_name = "N",
        default_value_t = 0
    )]
    pub device_implementation: u32,
    /// CTAs of the device-API implementation (1 to 128)
    #[arg(
        short = 'V',
        long = "device_cta_count",
        value_name = "N",
        default_value_t = 16
    )]
    pub device_cta_count: u32,
    /// 1: print the memory the buffers take after the footer
    #[arg(short = 'M', long = "memory", value_name = "0/1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub memory: u8,
    /// Start the send and receive buffers this many elements past their allocation (misaligned)
    #[arg(
        short = 'u',
        long = "unalign",
        value_name = "ELEMENTS",
        default_value_t = 0
    )]
    pub unalign: u64,
    /// 1: time every iteration and add i_min, i_max, i_p99 and i_cv% columns (max over ranks per iteration)
    #[arg(short = 'I', long = "per_iter_timing", value_name = "0/1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub per_iter_timing: u8,
    /// Leave the first N iterations out of the -I summary columns (the JSON keeps every time)
    #[arg(
        short = 'K',
        long = "per_iter_skip",
        value_name = "N",
        default_value_t = 0
    )]
    pub per_iter_skip: u64,
    /// 1: issue the calls on CUDA's default (NULL) stream
    #[arg(short = 'y', long = "stream_null", value_name = "0/1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub stream_null: u8,
    /// Local ranks to start [default: cpu: 2 for sendrecv, else 4; cuda: every visible GPU, in multiples of -t x -g]
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Executor
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// How local ranks run [default: process, or the external launcher's processes when one is detected]
    #[arg(long, value_enum)]
    pub launch: Option<LaunchKind>,
    /// Also run every size through this NCCL-API library (e.g. NVIDIA's libnccl.so.2), interleaved, on the same buffers; adds its time, busbw and a ratio column (out-of-place)
    #[arg(long, value_name = "PATH")]
    pub compare: Option<PathBuf>,
    /// CUDA backend: the NCCL-API library measured [default: oxccl's libnccl.so.2 or libnccl.so next to the oxccl executable, else ../lib/libnccl.so.2 (an install)]
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// Spread the rank processes over N pretend hosts (NCCL_HOSTID per process, in contiguous blocks), so ranks of different "hosts" go through the network path: oxccl's TCP transport and GPU proxies, NCCL's socket transport under --compare/--lib
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub hosts: usize,
    /// CUDA backend: more ranks than GPUs, sharing them in turn (a process's GPU i is ordinal i mod the GPUs); the kernels of one process run side by side on a shared GPU, so this studies kernels and checks results on fewer GPUs: it measures no link. Not with --compare (NCCL refuses ranks sharing a GPU)
    #[arg(long)]
    pub share_gpus: bool,
}

/// Where this invocation's ranks come from.
#[derive(Clone, Debug)]
pub enum Launch {
    /// Start `ranks / threads` child processes.
    Process,
    /// Run every rank as a thread here.
    Thread,
    /// Be `threads` ranks of an external launcher's world.
    External(launch::External),
}

/// Validated settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub coll: Coll,
    pub sizes: Vec<u64>,
    pub minbytes: u64,
    pub maxbytes: u64,
    pub stepbytes: u64,
    pub stepfactor: u64,
    pub iters: u64,
    pub warmup: u64,
    pub agg: u64,
    pub check: u64,
    pub ops: Vec<RedOp>,
    pub types: Vec<DataType>,
    /// The first (or only) root of a rooted collective; 0 otherwise.
    pub root: usize,
    /// Every root the sweep visits, in order (`-r all`: each rank).
    pub roots: Vec<usize>,
    /// `-N`: sweeps to run (0: until interrupted).
    pub cycles: u64,
    /// `-p 1`.
    pub parallel_init: bool,
    /// `-C 1`: report the time to issue the calls.
    pub cputime: bool,
    /// `-S 1`: a local time at the end of each line.
    pub timestamps: bool,
    /// `-u`: elements the buffers start past their allocation.
    pub unalign: usize,
    /// `-I 1`: per-iteration times and their summary columns.
    pub per_iter: bool,
    /// `-K`: iterations left out of the `-I` summary.
    pub per_iter_skip: usize,
    /// `-M 1`: print the buffers' memory after the footer.
    pub memory_report: bool,
    pub threads: usize,
    pub average: u8,
    pub blocking: u8,
    pub timeout: Option<Duration>,
    pub json: Option<PathBuf>,
    /// Ranks of the whole world.
    pub nranks: usize,
    pub launch: Launch,
    /// `--compare`: the other library.
    pub compare: Option<compare::Lib>,
    /// `--compare`: the other library's unique id, once made (rank 0's side) or received.
    pub compare_id: Option<[u8; 128]>,
    /// `cpu` or `cuda` (never `auto`).
    pub backend: Backend,
    /// GPUs per thread (`-g`; 1 for the CPU backend).
    pub ngpus: usize,
    /// CUDA graph replays (`-G`; 0: no graph).
    pub graph: u64,
    /// CUDA backend: the measured library.
    pub lib: Option<compare::Lib>,
    /// `--hosts`: pretend hosts the rank processes are spread over (1: one).
    pub hosts: usize,
    /// `--share-gpus`: ranks may outnumber the GPUs (ordinal mod GPUs).
    pub share_gpus: bool,
}

/// `NCCL_HOSTID` of local process `p` of `procs` spread over `hosts`
/// pretend hosts in contiguous blocks (None for one host).
pub fn pretend_host(p: usize, procs: usize, hosts: usize) -> Option<String> {
    (hosts > 1).then(|| format!("oxccl-perf-host-{}", p * hosts / procs.max(1)))
}

/// The most local ranks one invocation starts.
const MAX_LOCAL_RANKS: usize = 1024;

/// How long the CUDA backend waits for a GPU or a library call when `-T` is
/// 0: oxccl's own default operation timeout (`OXCCL_TIMEOUT_MS`, 600 s).
pub const GPU_DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Why there is no usable GPU, in a few words.
fn no_gpu_reason() -> Option<String> {
    use oxccl::gpu::tools::Unavailable;
    match oxccl::gpu::tools::probe_driver() {
        Err(Unavailable::NoDriver { .. }) => {
            Some("no CUDA driver: libcuda.so.1 is not in the dynamic loader's path".into())
        }
        Err(Unavailable::NoGpu { reason, .. }) => Some(format!("no GPU: {reason}")),
        Err(Unavailable::Failed(e)) => Some(e.message().to_string()),
        Ok(_) => oxccl::gpu::tools::timing::require()
            .err()
            .map(|e| e.message().to_string()),
    }
}

/// oxccl's libnccl next to this executable, if it is there.
pub fn default_lib_path() -> Option<PathBuf> {
    default_lib().0
}

/// oxccl's libnccl for this executable ([`crate::libpath::find`]: beside
/// it, in `../lib/`, or in the wheel's package), and the executable's path
/// for messages.
fn default_lib() -> (Option<PathBuf>, String) {
    let shown = std::env::current_exe().map_or_else(
        |_| "the oxccl executable".into(),
        |p| p.display().to_string(),
    );
    (crate::libpath::find().ok(), shown)
}

/// The sizes nccl-tests visits: from `min` to `max`, times `factor` when it
/// is above 1, else plus `step`.
pub fn sizes(min: u64, max: u64, step: u64, factor: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        let next = if factor > 1 {
            s.saturating_mul(factor).max(s + 1)
        } else {
            s.saturating_add(step)
        };
        if next == s || next == u64::MAX {
            break;
        }
        s = next;
    }
    v
}

impl Settings {
    /// Checks the flags against each other and the environment.
    pub fn from_args(a: &PerfArgs) -> Result<Settings, UsageError> {
        let coll = Coll::parse(&a.collective).ok_or_else(|| {
            UsageError(format!(
                "unknown collective '{}' (accepted: {})",
                a.collective,
                Coll::ALL.map(|c| c.name()).join(", ")
            ))
        })?;
        let minbytes = size_flag("-b/--minbytes", &a.minbytes)?;
        let maxbytes = size_flag("-e/--maxbytes", &a.maxbytes)?;
        let stepbytes = size_flag("-i/--stepbytes", &a.stepbytes)?;
        let root_sel = parse_root(&a.root)
            .map_err(|why| UsageError(format!("-r/--root {}: {why}", a.root)))?;
        let backend = resolve_backend(a)?;
        check_feature_flags(a, backend)?;
        if a.stepfactor == 0 {
            return Err(UsageError(
                "-f/--stepfactor 0: accepted values are 1 (step by -i/--stepbytes) or more (multiply)".into(),
            ));
        }
        if minbytes > maxbytes {
            return Err(UsageError(format!(
                "-b/--minbytes {minbytes} is larger than -e/--maxbytes {maxbytes} (accepted: minbytes <= maxbytes)"
            )));
        }
        if a.stepfactor == 1 && stepbytes == 0 && minbytes < maxbytes {
            return Err(UsageError(
                "-i/--stepbytes 0 with -f/--stepfactor 1 never reaches -e/--maxbytes (accepted: a step of 1 byte or more, or -f 2 or more)".into(),
            ));
        }
        let threads = a.nthreads as usize;
        let (ngpus, devices) = match backend {
            Backend::Cuda => (
                a.ngpus as usize,
                oxccl::gpu::tools::timing::device_count().unwrap_or(0),
            ),
            _ => (1, 0),
        };
        let cuda = backend == Backend::Cuda;
        let external = if a.launch.is_none() {
            launch::External::detect(threads)?
        } else {
            None
        };
        let (launch, nranks) = match (&external, a.launch) {
            (Some(e), _) => {
                let world = e.world * threads * ngpus;
                if let Some(r) = a.ranks {
                    if r != world {
                        return Err(UsageError(format!(
                            "--ranks {r}: under {} the world is {world} ranks ({} processes x -t {threads}{}); leave --ranks out or pass --launch to start local ranks instead",
                            e.launcher, e.world, if cuda { format!(" x -g {ngpus}") } else { String::new() }
                        )));
                    }
                }
                (Launch::External(e.clone()), world)
            }
            (None, kind) => {
                let kind = kind.unwrap_or(LaunchKind::Process);
                // Ranks one process (or, for --launch thread, one thread) holds.
                let unit = match kind {
                    LaunchKind::Process => threads * ngpus,
                    LaunchKind::Thread => ngpus,
                };
                if cuda && unit > devices && !a.share_gpus {
                    return Err(UsageError(format!(
                        "{}: one process needs {unit} GPUs and this machine has {devices} (accepted: -t x -g up to {devices})",
                        if ngpus > 1 { format!("-g/--ngpus {ngpus}") } else { format!("-t/--nthreads {threads}") }
                    )));
                }
                let ranks = match a.ranks {
                    Some(r) => r,
                    None if cuda => (devices / unit).max(1) * unit,
                    None => coll.default_ranks(),
                };
                if ranks == 0 || ranks > MAX_LOCAL_RANKS {
                    return Err(UsageError(format!(
                        "--ranks {ranks}: accepted values are 1 to {MAX_LOCAL_RANKS}"
                    )));
                }
                if cuda && ranks > devices && !a.share_gpus {
                    return Err(UsageError(format!(
                        "--ranks {ranks}: the CUDA backend gives each rank its own GPU and this machine has {devices} (accepted: 1 to {devices})"
                    )));
                }
                match kind {
                    LaunchKind::Process => {
                        if ranks % threads != 0 {
                            return Err(UsageError(format!(
                                "-t/--nthreads {threads} does not divide --ranks {ranks} (accepted: a divisor of --ranks)"
                            )));
                        }
                        if ranks % unit != 0 {
                            return Err(UsageError(format!(
                                "-g/--ngpus {ngpus} x -t/--nthreads {threads} does not divide --ranks {ranks} (accepted: --ranks a multiple of {unit})"
                            )));
                        }
                        (Launch::Process, ranks)
                    }
                    LaunchKind::Thread => {
                        if ranks % ngpus != 0 {
                            return Err(UsageError(format!(
                                "-g/--ngpus {ngpus} does not divide --ranks {ranks} (accepted: --ranks a multiple of -g)"
                            )));
                        }
                        if threads != 1 && threads * ngpus != ranks {
                            return Err(UsageError(format!(
                                "-t/--nthreads {threads} with --launch thread: every rank is a thread of one process (accepted: 1 or --ranks)"
                            )));
                        }
                        (Launch::Thread, ranks)
                    }
                }
            }
        };
        if a.hosts == 0 {
            return Err(UsageError(
                "--hosts 0: accepted values are 1 (one host) or more".into(),
            ));
        }
        if a.hosts > 1 {
            let Launch::Process = launch else {
                return Err(UsageError(format!(
                    "--hosts {}: pretend hosts are given to rank processes that oxccl perf starts (accepted: --launch process, no external launcher)",
                    a.hosts
                )));
            };
            let procs = nranks / (threads * ngpus);
            if a.hosts > procs {
                return Err(UsageError(format!(
                    "--hosts {}: only {procs} rank processes to spread (accepted: 1 to {procs})",
                    a.hosts
                )));
            }
        }
        if a.share_gpus && (!cuda || a.compare.is_some()) {
            return Err(UsageError(
                "--share-gpus: only with --backend cuda and without --compare (NCCL refuses two ranks on one GPU; accepted: oxccl alone on the CUDA backend)".into(),
            ));
        }
        let compare = match &a.compare {
            None => None,
            Some(p) => {
                if let (Launch::External(e), false) = (&launch, cuda) {
                    return Err(UsageError(format!(
                        "--compare {}: not available under an external launcher ({}) with the CPU backend yet (accepted: local ranks, --launch process or thread, or --backend cuda)",
                        p.display(),
                        e.launcher
                    )));
                }
                Some(compare::Lib::load(p, coll).map_err(UsageError)?)
            }
        };
        let lib = match (cuda, &a.lib) {
            (false, Some(p)) => {
                return Err(UsageError(format!(
                    "--lib {}: only the CUDA backend runs a library (accepted with --backend cpu: leave --lib out)",
                    p.display()
                )))
            }
            (false, None) => None,
            (true, Some(p)) => Some(compare::Lib::load_as(p, coll, "--lib").map_err(UsageError)?),
            (true, None) => {
                let (found, exe) = default_lib();
                let Some(p) = found else {
                    return Err(UsageError(format!(
                        "--backend cuda: oxccl's libnccl.so.2 is not next to {exe} (nor in ../lib: build both with `cargo xtask build`, install both with `cargo xtask install --prefix DIR`, or pass --lib PATH)"
                    )));
                };
                Some(compare::Lib::load_as(&p, coll, "--lib").map_err(UsageError)?)
            }
        };
        let roots: Vec<usize> = match (coll.rooted(), root_sel) {
            (false, _) => vec![0],
            (true, RootSel::All) => (0..nranks).collect(),
            (true, RootSel::One(r)) if r < nranks => vec![r],
            (true, RootSel::One(r)) => {
                return Err(UsageError(format!(
                    "-r/--root {r}: accepted values are 0 to {} for {nranks} ranks, or all",
                    nranks - 1
                )))
            }
        };
        let sizes = sizes(minbytes, maxbytes, stepbytes, a.stepfactor);
        // Ranks whose buffers this host holds.
        let local = match &launch {
            Launch::External(_) => threads * ngpus,
            _ => nranks,
        };
        let need = memory::Need {
            coll,
            max_bytes: sizes.last().copied().unwrap_or(0),
            types: &a.datatype.0,
            nranks,
            local_ranks: local,
            agg: a.agg_iters,
            unalign: a.unalign,
        };
        if backend == Backend::Cpu {
            if let Some(avail) = memory::host_available() {
                memory::check_host(&need, avail).map_err(UsageError)?;
            }
        } else if devices > 0 {
            // Each rank's buffers on its GPU: one rank a GPU, or with
            // --share-gpus the local ranks spread over them.
            let per_gpu = if a.share_gpus {
                local.div_ceil(devices)
            } else {
                1
            };
            let smallest = (0..devices)
                .filter_map(|o| oxccl::gpu::tools::timing::device_info(o).ok())
                .min_by_key(|d| d.memory);
            if let Some(d) = smallest {
                memory::check_device(&need, per_gpu, d.memory, (&d.name, d.ordinal))
                    .map_err(UsageError)?;
            }
        }
        Ok(Settings {
            coll,
            sizes,
            minbytes,
            maxbytes,
            stepbytes,
            stepfactor: a.stepfactor,
            iters: a.iters,
            warmup: a.warmup_iters,
            agg: a.agg_iters,
            check: a.check,
            ops: if coll.reduces() {
                a.op.0.clone()
            } else {
                Vec::new()
            },
            types: a.datatype.0.clone(),
            root: roots[0],
            roots,
            cycles: a.run_cycles,
            parallel_init: a.parallel_init == 1,
            cputime: a.report_cputime == 1,
            timestamps: a.report_timestamps == 1,
            unalign: a.unalign as usize,
            per_iter: a.per_iter_timing == 1,
            per_iter_skip: a.per_iter_skip as usize,
            memory_report: a.memory == 1,
            threads: match external {
                None if a.launch == Some(LaunchKind::Thread) => nranks / ngpus,
                _ => threads,
            },
            average: a.average,
            blocking: a.blocking,
            timeout: (a.timeout > 0).then(|| Duration::from_secs(a.timeout)),
            json: a.output_file.clone(),
            nranks,
            launch,
            compare,
            compare_id: None,
            backend,
            ngpus,
            graph: a.cudagraph,
            lib,
            hosts: a.hosts,
            share_gpus: a.share_gpus,
        })
    }

    /// Workers: threads that each drive `ngpus` ranks (= ranks on the CPU backend).
    pub fn workers(&self) -> usize {
        self.nranks / self.ngpus
    }

    /// The longest a wait may take: `-T`, and for the CUDA backend (where a
    /// loaded library may have no timeout of its own) at most
    /// [`GPU_DEFAULT_TIMEOUT`] when `-T` is 0.
    pub fn wait_limit(&self) -> Option<Duration> {
        match self.backend {
            Backend::Cuda => Some(self.timeout.unwrap_or(GPU_DEFAULT_TIMEOUT)),
            _ => self.timeout,
        }
    }
}

/// nccl-tests' flags that oxccl perf cannot honour on `backend`: refused
/// with the reason, so a run never silently means something else.
fn check_feature_flags(a: &PerfArgs, backend: Backend) -> Result<(), UsageError> {
    let cuda = backend == Backend::Cuda;
    let refuse = |s: String| Err(UsageError(s));
    if a.device_implementation != 0 {
        return refuse(format!(
            "-D/--device_implementation {}: oxccl perf runs the collectives through the host API only (accepted: 0)",
            a.device_implementation
        ));
    }
    if !(1..=128).contains(&a.device_cta_count) {
        return refuse(format!(
            "-V/--device_cta_count {}: accepted values are 1 to 128",
            a.device_cta_count
        ));
    }
    if a.local_register != 0 {
        let what = if a.local_register == 1 {
            "register buffers"
        } else {
            "symmetric windows"
        };
        return refuse(if cuda {
            format!("-R {} ({what}): not implemented by the CUDA backend of oxccl perf yet (accepted: 0)", a.local_register)
        } else {
            format!("-R {} ({what}) needs --backend cuda: host buffers have nothing to register (accepted: 0)", a.local_register)
        });
    }
    if let Some(x) = a.cta_policy {
        return refuse(if cuda {
            format!("-x {x} (CTA policy): not implemented by the CUDA backend of oxccl perf yet (leave -x out)")
        } else {
            format!("-x {x} (CTA policy) needs --backend cuda: host collectives launch no CTAs (leave -x out)")
        });
    }
    if a.stream_null != 0 {
        return refuse(if cuda {
            "-y 1 (CUDA's default stream): not implemented by the CUDA backend of oxccl perf yet (accepted: 0)".into()
        } else {
            "-y 1 (CUDA's default stream) needs --backend cuda: host collectives use no stream (accepted: 0)".into()
        });
    }
    if a.unalign != 0 && cuda {
        return refuse(format!(
            "-u {} (misaligned buffers): not implemented by the CUDA backend of oxccl perf yet (accepted there: 0)",
            a.unalign
        ));
    }
    if a.per_iter_timing == 1 {
        if cuda {
            return refuse("-I 1 (per-iteration timing): not implemented by the CUDA backend of oxccl perf yet (accepted there: 0)".into());
        }
        if a.cudagraph != 0 {
            return refuse("-I 1 (per-iteration timing) with -G: a graph replays every iteration at once (accepted: -G 0)".into());
        }
    }
    if a.per_iter_skip != 0 {
        if a.per_iter_timing == 0 {
            return refuse(format!(
                "-K/--per_iter_skip {}: needs -I 1 (per-iteration timing)",
                a.per_iter_skip
            ));
        }
        if a.per_iter_skip >= a.iters {
            return refuse(format!(
                "-K/--per_iter_skip {}: accepted values are 0 to {} (below -n/--iters {})",
                a.per_iter_skip,
                a.iters - 1,
                a.iters
            ));
        }
    }
    Ok(())
}

/// `--backend` as it will run: `cpu` or `cuda`.
fn resolve_backend(a: &PerfArgs) -> Result<Backend, UsageError> {
    let cpu_only = |why: &str| -> Result<Backend, UsageError> {
        if a.ngpus != 1 {
            return Err(UsageError(format!(
                "-g/--ngpus {}: {why} (accepted: 1)",
                a.ngpus
            )));
        }
        if a.cudagraph != 0 {
            return Err(UsageError(format!(
                "-G/--cudagraph {}: {why} (accepted: 0)",
                a.cudagraph
            )));
        }
        Ok(Backend::Cpu)
    };
    match a.backend {
        Backend::Cpu => cpu_only("GPUs need --backend cuda or auto, not --backend cpu"),
        Backend::Cuda => match no_gpu_reason() {
            None => Ok(Backend::Cuda),
            Some(why) => Err(UsageError(format!(
                "--backend cuda: no usable GPU here ({why}) (accepted here: --backend cpu or auto)"
            ))),
        },
        Backend::Auto => match no_gpu_reason() {
            Some(why) => {
                if let Some(p) = &a.lib {
                    return Err(UsageError(format!(
                        "--lib {}: no usable GPU here ({why}) (accepted without a GPU: leave --lib out)",
                        p.display()
                    )));
                }
                cpu_only(&format!("no usable GPU here ({why})"))
            }
            None => {
                // A GPU but no library to drive it: host memory, unless the
                // command line asked for GPU features.
                let gpu_asked = a.ngpus != 1 || a.cudagraph != 0;
                if a.lib.is_none() && default_lib().0.is_none() && !gpu_asked {
                    if !launch::is_child() {
                        eprintln!(
                            "oxccl perf: --backend auto: a GPU is here but oxccl's libnccl.so.2 is not next to {}; running on host memory (pass --lib PATH or --backend cuda)",
                            default_lib().1
                        );
                    }
                    return Ok(Backend::Cpu);
                }
                Ok(Backend::Cuda)
            }
        },
    }
}

/// Runs `oxccl perf`; returns the exit status.
pub fn main(args: &PerfArgs) -> i32 {
    let s = match Settings::from_args(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("oxccl perf: {}", e.0);
            return 2;
        }
    };
    launch::run(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretend_hosts_are_contiguous_blocks() {
        let hosts: Vec<_> = (0..4).map(|p| pretend_host(p, 4, 2)).collect();
        let names: Vec<&str> = hosts.iter().map(|h| h.as_deref().unwrap()).collect();
        assert_eq!(
            names,
            [
                "oxccl-perf-host-0",
                "oxccl-perf-host-0",
                "oxccl-perf-host-1",
                "oxccl-perf-host-1"
            ]
        );
        // Uneven: 3 processes on 2 hosts.
        assert_eq!(pretend_host(1, 3, 2).as_deref(), Some("oxccl-perf-host-0"));
        assert_eq!(pretend_host(2, 3, 2).as_deref(), Some("oxccl-perf-host-1"));
        // One host: nothing set.
        assert_eq!(pretend_host(3, 4, 1), None);
    }

    #[test]
    fn size_parsing() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("128M"), Ok(128 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1").is_err());
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("-5"), Err(SIZE_ACCEPTED.to_string()));
        assert!(parse_size("20000000000G").is_err());
        assert_eq!(parse_root("all"), Ok(RootSel::All));
        assert_eq!(parse_root("-1"), Ok(RootSel::All));
        assert_eq!(parse_root("3"), Ok(RootSel::One(3)));
        assert!(parse_root("x").is_err());
    }

    #[test]
    fn size_sweeps() {
        assert_eq!(sizes(8, 64, 0, 2), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 0, 4), vec![8, 32]);
        assert_eq!(sizes(0, 4, 0, 2), vec![0, 1, 2, 4]);
        assert_eq!(sizes(1, 3, 1, 1), vec![1, 2, 3]);
        assert_eq!(sizes(5, 5, 0, 1), vec![5]);
    }
}
