//! Rank 0's one-line progress bar on stderr, drawn only when stderr is a
//! terminal (pipes and files get nothing extra, so logged output is stable).

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Cases done out of the sweep's total, the size running now, time elapsed.
pub struct Progress {
    total: usize,
    done: usize,
    current: u64,
    t0: Instant,
}

/// `bytes` as the plot's axis writes it: 8 B, 64 KB, 1 MB, 2 GB (powers of 1024).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl Progress {
    /// A bar for `total` cases, or None when stderr is not a terminal.
    pub fn on_terminal(total: usize) -> Option<Progress> {
        (std::io::stderr().is_terminal() && total > 0).then(|| Progress::new(total))
    }

    fn new(total: usize) -> Progress {
        Progress {
            total,
            done: 0,
            current: 0,
            t0: Instant::now(),
        }
    }

    /// The line drawn (without the carriage return and erase).
    pub fn line(&self) -> String {
        const WIDTH: usize = 30;
        let filled = (self.done * WIDTH) / self.total.max(1);
        format!(
            "oxccl perf [{}{}] {}/{} cases, size {}, {:.1} s",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            self.done,
            self.total,
            human_size(self.current),
            self.t0.elapsed().as_secs_f64()
        )
    }

    fn draw(&self) {
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K{}", self.line());
        let _ = e.flush();
    }

    /// A case of `bytes` begins.
    pub fn start_case(&mut self, bytes: u64) {
        self.current = bytes;
        self.draw();
    }

    /// The case that began last is done.
    pub fn finish_case(&mut self) {
        self.done = (self.done + 1).min(self.total);
        self.draw();
    }

    /// Erases the bar (before a table line, and at the end).
    pub fn clear(&self) {
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K");
        let _ = e.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_the_axis() {
        assert_eq!(human_size(8), "8 B");
        assert_eq!(human_size(1024), "1 KB");
        assert_eq!(human_size(1536), "1.5 KB");
        assert_eq!(human_size(128 << 20), "128 MB");
        assert_eq!(human_size(2 << 30), "2 GB");
    }

    #[test]
    fn bar_counts_cases() {
        let mut p = Progress::new(4);
        p.current = 1 << 20;
        p.done = 2;
        let l = p.line();
        assert!(l.contains("2/4 cases"), "{l}");
        assert!(l.contains("size 1 MB"), "{l}");
        assert!(
            l.contains(&format!("[{}{}]", "#".repeat(15), "-".repeat(15))),
            "{l}"
        );
    }
}
