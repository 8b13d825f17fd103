//! What the driver knows about each workload of `tlmalloc-workload`: its
//! arguments at each budget, its family (for the charts), the figures its
//! tables show, and how long a run of it takes (for the progress bar).

/// How much time the suite may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Budget {
    /// For tests: tiny budgets, figures meaningless.
    Smoke,
    /// `--quick`: the whole suite in under 3 minutes on 2 cores.
    Quick,
    /// The default: longer runs and every `loop` size.
    Full,
}

/// Which chart a workload's headline figure goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `loop`: its own throughput-against-size chart.
    Loop,
    /// Allocation-heavy single-heap workloads: throughput.
    Throughput,
    /// Blocks crossing threads: throughput.
    CrossThread,
    /// Latency percentiles.
    Latency,
    /// Resident memory.
    Memory,
}

impl Family {
    pub fn title(self) -> &'static str {
        match self {
            Family::Loop => "loop",
            Family::Throughput => "throughput",
            Family::CrossThread => "cross-thread",
            Family::Latency => "latency",
            Family::Memory => "memory",
        }
    }
}

/// A figure a workload reports.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub key: &'static str,
    /// Column label.
    pub label: &'static str,
    /// Unit after scaling.
    pub unit: &'static str,
    pub higher_is_better: bool,
    /// Divide the raw value by this to display it (KiB → MiB: 1024).
    pub divisor: f64,
}

pub const METRICS: &[Metric] = &[
    Metric {
        key: "mops",
        label: "throughput",
        unit: "M ops/s",
        higher_is_better: true,
        divisor: 1.0,
    },
    Metric {
        key: "p50_ns",
        label: "p50",
        unit: "ns",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "p99_ns",
        label: "p99",
        unit: "ns",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "p999_ns",
        label: "p99.9",
        unit: "ns",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "mean_ns",
        label: "mean (to p99.9)",
        unit: "ns",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "max_ns",
        label: "max",
        unit: "ns",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "threads_per_sec",
        label: "threads created",
        unit: "threads/s",
        higher_is_better: true,
        divisor: 1.0,
    },
    Metric {
        key: "rss_growth_kib",
        label: "RSS growth",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_kib",
        label: "RSS at end",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "peak_rss_kib",
        label: "peak RSS",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_over_live",
        label: "RSS / live (end)",
        unit: "×",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "rss_over_live_after_free",
        label: "RSS / live (after 90 % freed)",
        unit: "×",
        higher_is_better: false,
        divisor: 1.0,
    },
    Metric {
        key: "rss_over_live_first_phase",
        label: "RSS / live (first phase)",
        unit: "×",
        higher_is_better: false,
        divisor: 1.0,
    },
];

/// The description of a metric key (a neutral one for keys not listed).
pub fn metric(key: &str) -> Metric {
    METRICS
        .iter()
        .copied()
        .find(|m| m.key == key)
        .unwrap_or(Metric {
            key: "",
            label: "",
            unit: "",
            higher_is_better: true,
            divisor: 1.0,
        })
}

/// One workload of the suite.
#[derive(Debug)]
pub struct Workload {
    pub name: &'static str,
    pub family: Family,
    /// One sentence for the report.
    pub about: &'static str,
    /// Whether it runs at each `--threads` count (else once, one thread).
    pub threaded: bool,
    /// The fewest threads it can run with (counts below are raised).
    pub min_threads: usize,
    /// The figures its tables show, first the one its chart shows.
    pub headline: &'static [&'static str],
}

pub const WORKLOADS: &[Workload] = &[
    Workload {
        name: "loop",
        family: Family::Loop,
        about: "`malloc(N)`, touch the first byte, `free`, for N from 16 B to 96 MiB (powers of two and 1.5× powers); an operation is one malloc+free pair, on every thread.",
        threaded: true,
        min_threads: 1,
        headline: &["mops"],
    },
    Workload {
        name: "balanced",
        family: Family::Throughput,
        about: "per operation one 256 B, one 128 B, four 80 B and eight 48 B objects, zeroed, linked, freed; every 4th operation also four random 1–32 KiB blocks freed LIFO (a build tool's graph parser).",
        threaded: true,
        min_threads: 1,
        headline: &["mops", "p99_ns"],
    },
    Workload {
        name: "alloc-heavy",
        family: Family::Throughput,
        about: "4096 80-byte blocks outstanding per thread, then all freed, repeatedly; an operation is one malloc+free pair.",
        threaded: true,
        min_threads: 1,
        headline: &["mops"],
    },
    Workload {
        name: "fixed",
        family: Family::Throughput,
        about: "64-byte churn: each thread keeps 256 blocks and replaces a random one per operation.",
        threaded: true,
        min_threads: 1,
        headline: &["mops"],
    },
    Workload {
        name: "mixed",
        family: Family::Throughput,
        about: "log-uniform sizes 8 B–4 KiB, a random live set of up to 10 000 blocks per thread; an operation is one malloc or one free (10 million in all; 1 million with --quick).",
        threaded: true,
        min_threads: 1,
        headline: &["mops", "p99_ns"],
    },
    Workload {
        name: "latency",
        family: Family::Latency,
        about: "the time of a single 64-byte malloc and of a single free (rounds of 256 mallocs, then 256 frees), TSC-timed, timer overhead subtracted.",
        threaded: true,
        min_threads: 1,
        headline: &["p50_ns", "p99_ns", "p999_ns", "mean_ns"],
    },
    Workload {
        name: "xthread",
        family: Family::CrossThread,
        about: "producer threads allocate 64-byte blocks and hand them through bounded queues to consumer threads that free them (T/2 of each, at least one); an operation is one block passed and freed.",
        threaded: true,
        min_threads: 2,
        headline: &["mops"],
    },
    Workload {
        name: "migrate",
        family: Family::CrossThread,
        about: "objects of 16–256 B passed between threads at random (1–4 hops) before the last receiver frees them, at most 16 384 per thread in flight; an operation is one object's life.",
        threaded: true,
        min_threads: 2,
        headline: &["mops"],
    },
    Workload {
        name: "server",
        family: Family::CrossThread,
        about: "`mode=server`: long-lived threads replace random blocks of 8 B–16 KiB in a 2000-block live set, 20 % of the old blocks freed by another thread (with one thread, all freed locally); `mode=larson`: the larson server simulation (1000 blocks of 16–1000 B per client slot, each thread hands its blocks to a successor thread after 10 000 replacements; thread creation is part of it).",
        threaded: true,
        min_threads: 1,
        headline: &["mops", "p99_ns"],
    },
    Workload {
        name: "churn",
        family: Family::Memory,
        about: "short-lived threads, T at a time, each allocating 1000 blocks of 16 B–4 KiB and freeing them (8 left for its successor to free); resident memory after all of them (1000 threads; 200 with --quick).",
        threaded: true,
        min_threads: 1,
        headline: &["rss_growth_kib", "threads_per_sec"],
    },
    Workload {
        name: "fragmentation",
        family: Family::Memory,
        about: "allocate many blocks of 16 B–1 KiB (1 million; 200 000 with --quick), free a random 90 %, then allocate blocks of 1–16 KiB up to the first phase's live bytes; resident set (less the process's before) over live bytes.",
        threaded: false,
        min_threads: 1,
        headline: &["rss_over_live", "rss_over_live_after_free", "peak_rss_kib"],
    },
];

/// The workload called `name`.
pub fn find(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// The `loop` sizes of the quick run (the full run takes all 46).
pub const QUICK_LOOP_SIZES: &str = "16,64,256,1K,4K,16K,64K,256K,1M,4M,16M,96M";

impl Workload {
    /// The thread counts it runs at, from the requested ones.
    pub fn thread_counts(&self, requested: &[usize]) -> Vec<usize> {
        if !self.threaded {
            return vec![1];
        }
        let mut counts: Vec<usize> = Vec::new();
        for &t in requested {
            let t = t.max(self.min_threads);
            if !counts.contains(&t) {
                counts.push(t);
            }
        }
        counts
    }

    /// Its arguments to `tlmalloc-workload` (after the workload name and
    /// before `--threads`), at a budget, with an optional override of the
    /// time-bounded runs' length.
    pub fn args(&self, budget: Budget, duration_ms: Option<u64>) -> Vec<String> {
        let ms = duration_ms.unwrap_or(match (budget, self.name) {
            (Budget::Smoke, _) => 10,
            (Budget::Quick, "loop") => 40,
            (Budget::Quick, _) => 150,
            (Budget::Full, "loop") => 80,
            (Budget::Full, _) => 300,
        });
        let pick = |smoke: u64, quick: u64, full: u64| match budget {
            Budget::Smoke => smoke,
            Budget::Quick => quick,
            Budget::Full => full,
        };
        let mut args = vec!["--ms".to_string(), ms.to_string()];
        match self.name {
            "loop" => match budget {
                Budget::Smoke => args.extend(["--sizes".into(), "16,4K".into()]),
                Budget::Quick => args.extend(["--sizes".into(), QUICK_LOOP_SIZES.into()]),
                Budget::Full => {}
            },
            "mixed" => args.extend([
                "--ops".into(),
                pick(20_000, 1_000_000, 10_000_000).to_string(),
            ]),
            "latency" => args.extend([
                "--samples".into(),
                pick(2_560, 200_000, 1_000_000).to_string(),
            ]),
            "churn" => args.extend(["--count".into(), pick(8, 200, 1000).to_string()]),
            "fragmentation" => args.extend([
                "--blocks".into(),
                pick(2_000, 200_000, 1_000_000).to_string(),
            ]),
            "server" => args.extend(["--lifetime".into(), pick(1_000, 10_000, 10_000).to_string()]),
            _ => {}
        }
        args
    }

    /// Roughly how long one run takes (ms), for the progress bar's ETA.
    pub fn estimate_ms(&self, budget: Budget, duration_ms: Option<u64>, threads: usize) -> u64 {
        let args = self.args(budget, duration_ms);
        let ms: u64 = args[1].parse().unwrap_or(100);
        let start = 40; // process start, timer calibration
        let t = threads.max(1) as u64;
        start
            + match self.name {
                "loop" => {
                    let sizes = match budget {
                        Budget::Smoke => 2,
                        Budget::Quick => QUICK_LOOP_SIZES.split(',').count() as u64,
                        Budget::Full => 46,
                    };
                    sizes * (ms + 25)
                }
                "server" => 2 * (ms + 30),
                "mixed" => pick_u64(budget, 10, 150, 1200),
                "latency" => pick_u64(budget, 10, 60, 250) * t.min(4),
                "churn" => pick_u64(budget, 10, 200, 1000) * t.min(4) / t.min(2),
                "fragmentation" => pick_u64(budget, 10, 150, 700),
                _ => ms + 30,
            }
    }
}

fn pick_u64(budget: Budget, smoke: u64, quick: u64, full: u64) -> u64 {
    match budget {
        Budget::Smoke => smoke,
        Budget::Quick => quick,
        Budget::Full => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for w in WORKLOADS {
            assert_eq!(find(w.name).unwrap().name, w.name);
            assert!(!w.headline.is_empty());
            for h in w.headline {
                assert_eq!(metric(h).key, *h, "{h} is not in METRICS");
            }
        }
        assert_eq!(WORKLOADS.len(), 11);
        assert!(find("nope").is_none());
    }

    #[test]
    fn thread_counts_respect_minimum_and_dedupe() {
        let x = find("xthread").unwrap();
        assert_eq!(x.thread_counts(&[1, 2, 4]), [2, 4]);
        assert_eq!(find("loop").unwrap().thread_counts(&[1, 2]), [1, 2]);
        assert_eq!(
            find("fragmentation").unwrap().thread_counts(&[1, 2, 8]),
            [1]
        );
    }

    #[test]
    fn args_at_each_budget() {
        let l = find("loop").unwrap();
        assert!(l
            .args(Budget::Quick, None)
            .contains(&QUICK_LOOP_SIZES.to_string()));
        assert!(!l.args(Budget::Full, None).contains(&"--sizes".to_string()));
        assert_eq!(
            find("fixed").unwrap().args(Budget::Full, Some(7))[..2],
            ["--ms", "7"]
        );
        for w in WORKLOADS {
            for b in [Budget::Smoke, Budget::Quick, Budget::Full] {
                assert!(w.estimate_ms(b, None, 2) > 0);
            }
        }
    }
}
