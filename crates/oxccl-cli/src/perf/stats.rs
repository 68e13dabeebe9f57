//! Per-iteration time statistics (`oxccl perf -I`): computed by the runs,
//! printed by the table.

/// Summary of one half's per-iteration times (seconds), as nccl-tests' `-I`
/// reports them: percentiles by nearest rank, the deviation over all samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IterStats {
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub stdev: f64,
    /// Deviation over mean, in percent (0 when the mean is 0).
    pub cv_pct: f64,
}

/// Statistics of `times` (not empty).
pub fn iter_stats(times: &[f64]) -> IterStats {
    let mut v = times.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // Nearest rank: the ceil(n p / 100)-th smallest sample.
    let rank = |p: usize| v[((n * p).div_ceil(100)).clamp(1, n) - 1];
    let avg = v.iter().sum::<f64>() / n as f64;
    let stdev = (v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64).sqrt();
    IterStats {
        min: v[0],
        max: v[n - 1],
        avg,
        p50: v[n / 2],
        p95: rank(95),
        p99: rank(99),
        stdev,
        cv_pct: if avg > 0.0 { stdev / avg * 100.0 } else { 0.0 },
    }
}
