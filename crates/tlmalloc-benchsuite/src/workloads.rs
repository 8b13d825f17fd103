//! What the driver knows about each workload of `tlmalloc-workload`: its
//! arguments at each budget, its family (for the charts), the figures its
//! tables show, and how long a run of it takes (for the progress bar).

/// How much time the suite may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Budget {
    /// For tests: tiny budgets, figures meaningless.
    Smoke,
    /// `--quick`: the whole suite in some 5 minutes on 2 cores (3 runs, short
    /// measurements, a 0.1 s settle before the RSS after free).
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
        key: "rt_violations",
        label: "realtime violations",
        unit: "calls",
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
        key: "rss_after_free_kib",
        label: "RSS after free",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_freed_kib",
        label: "RSS at the free",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_idle_500ms_kib",
        label: "RSS 0.5 s after",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_idle_1s_kib",
        label: "RSS 1 s after",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_idle_2s_kib",
        label: "RSS 2 s after",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "rss_idle_5s_kib",
        label: "RSS 5 s after",
        unit: "MiB",
        higher_is_better: false,
        divisor: 1024.0,
    },
    Metric {
        key: "time_s",
        label: "time",
        unit: "s",
        higher_is_better: false,
        divisor: 1.0,
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
        about: "producer threads allocate 64-byte blocks and hand them through bounded queues to consumer threads that free them (T/2 of each, at least one; xmalloc-test's producer-consumer pattern); an operation is one block passed and freed.",
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
        about: "`mode=server` (rptest-like): long-lived threads replace random blocks of 8 B–16 KiB in a 2000-block live set, 20 % of the old blocks freed by another thread through its inbox (with one thread, all freed locally); `mode=larson` (the handover churn): the larson server simulation (1000 blocks of 16–1000 B per client slot, each thread replaces blocks of the array it inherited 10 000 times, hands the array to a new successor thread and exits; thread creation is part of it, and every thread is detached, so an exited one is reaped at once and peak RSS measures the allocator, not unjoined stacks).",
        threaded: true,
        min_threads: 1,
        headline: &["mops", "p99_ns", "peak_rss_kib", "rss_after_free_kib"],
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
    Workload {
        name: "burst-idle",
        family: Family::Memory,
        about: "2 threads allocate 1 GiB in all (256 MiB with --quick), half in blocks of 16 B–2 KiB and half in blocks of 64 KiB–4 MiB, mixed, write every byte, free it all, then idle 5 s (2.5 s with --quick), each thread making one 64-byte malloc/free every 50 ms; the resident set at the free and 0.5, 1, 2 and 5 s after it (the live footprint is then the program's pointer arrays and size plans: 12 bytes a block, 15 MiB at 1 GiB), and the burst's time.",
        threaded: false,
        min_threads: 2,
        headline: &[
            "rss_freed_kib",
            "rss_idle_500ms_kib",
            "rss_idle_1s_kib",
            "rss_idle_2s_kib",
            "rss_idle_5s_kib",
            "peak_rss_kib",
            "time_s",
        ],
    },
    Workload {
        name: "thread-recreate",
        family: Family::Memory,
        about: "T threads re-created 250 times (100 with --quick), each allocating 1000 objects of 16–256 B (1 % of them 100–10 000× larger) into a shared FIFO queue of 1024 objects and freeing the oldest it pushes out, so objects outlive their threads and are freed by others; time, peak RSS, and RSS after the queue is freed.",
        threaded: true,
        min_threads: 1,
        headline: &["time_s", "peak_rss_kib", "rss_after_free_kib"],
    },
    Workload {
        name: "large-buffers",
        family: Family::Memory,
        about: "20 live buffers of 5–25 MB (uniform sizes), one replaced at random 2000 times (200 with --quick), every byte of each new buffer written (non-zero); time and peak RSS.",
        threaded: false,
        min_threads: 1,
        headline: &["time_s", "peak_rss_kib", "rss_after_free_kib"],
    },
    Workload {
        name: "fresh-tail",
        family: Family::Latency,
        about: "500 000 `malloc(64)` per thread with no frees, each timed alone (TSC, timer overhead subtracted): the heap only grows, so every page, segment or mapping the allocator takes shows in the tail.",
        threaded: true,
        min_threads: 1,
        headline: &["p50_ns", "p99_ns", "p999_ns", "max_ns"],
    },
    Workload {
        name: "cpython",
        family: Family::Throughput,
        about: "`python3` with `PYTHONMALLOC=malloc` (every object through malloc) `mode=dict` builds a dict of 2 million entries (100 000 with --quick), dumps it to JSON, loads it, sorts the keys and frees it all: the script's time (not the interpreter's start), its peak RSS and its RSS after freeing; `mode=tests` runs CPython's own `test_json`, `test_dict` and `test_unicode` (`test_dict` alone with --quick) with `python3 -m test`: wall time with the interpreter's start, CPU times, peak RSS. Skipped without `python3`.",
        threaded: false,
        min_threads: 1,
        headline: &["time_s", "peak_rss_kib", "rss_after_free_kib"],
    },
    Workload {
        name: "realtime",
        family: Family::Latency,
        about: "a thread marked realtime (tlmalloc's `tl_prewarm` of its working set, then `tl_rt_thread(TL_RT_DEFER)`; `tl_rt_drain` between rounds) against an unmarked one, taking turns round by round while T interference threads replace blocks of 16 B–32 MiB and mmap/munmap 4 MiB, every page written: `xfree`, the free of a 64-byte block another thread allocated and a 64-byte malloc, each timed alone (rounds of 256; 500 000 of each, 50 000 with --quick); `large`, malloc and free of 160, 200 and 256 MiB blocks (above the recycle cache), every page written between (16 rounds, 4 with --quick: 48 and 12 samples); TSC, timer overhead subtracted; the marked thread's memory system calls inside the allocator (`tl_rt_violations`, 0 when the contract holds). Other allocators have no marked thread: their marked rows are empty.",
        threaded: false,
        min_threads: 1,
        headline: &["p50_ns", "p99_ns", "p999_ns", "max_ns", "rt_violations"],
    },
];

/// The one case of `realtime` whose memory figures the memory tables show
/// (every line of its process has the same ones; this one every allocator
/// prints, marked thread or not).
pub const REALTIME_MEMORY_CASE: &str = "scenario=xfree thread=unmarked op=malloc";

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
            return vec![self.min_threads];
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
            "burst-idle" => args.extend([
                "--bytes".into(),
                pick(8 << 20, 256 << 20, 1 << 30).to_string(),
                "--idle-ms".into(),
                pick(600, 2_500, 5_000).to_string(),
            ]),
            "thread-recreate" => {
                args.extend(["--generations".into(), pick(4, 100, 250).to_string()])
            }
            "large-buffers" => {
                args.extend(["--replacements".into(), pick(4, 200, 2_000).to_string()])
            }
            "fresh-tail" => args.extend([
                "--samples".into(),
                pick(5_000, 500_000, 500_000).to_string(),
            ]),
            "cpython" => args.extend([
                "--entries".into(),
                pick(2_000, 100_000, 2_000_000).to_string(),
                "--py-tests".into(),
                match budget {
                    Budget::Smoke => "none",
                    Budget::Quick => "test_dict",
                    Budget::Full => "test_json,test_dict,test_unicode",
                }
                .into(),
            ]),
            "realtime" => args.extend([
                "--samples".into(),
                pick(2_560, 50_000, 500_000).to_string(),
                "--rounds".into(),
                pick(1, 4, 16).to_string(),
            ]),
            _ => {}
        }
        args.extend(["--settle-ms".into(), settle_ms(budget).to_string()]);
        args
    }

    /// Why it cannot run on this machine, if it cannot (`cpython` without
    /// `python3` on `PATH`).
    pub fn missing(&self) -> Option<String> {
        if self.name != "cpython" {
            return None;
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = std::env::split_paths(&path).any(|d| d.join("python3").is_file());
        (!found).then(|| "python3 is not on PATH".to_string())
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
                "burst-idle" => pick_u64(budget, 650, 2_900, 6_500),
                "thread-recreate" => pick_u64(budget, 10, 150, 400) * t.min(2),
                "large-buffers" => pick_u64(budget, 30, 1_200, 12_000),
                "fresh-tail" => pick_u64(budget, 10, 120, 120) * t.min(2),
                "cpython" => pick_u64(budget, 150, 3_000, 32_000),
                "realtime" => pick_u64(budget, 1_500, 4_500, 15_000),
                _ => ms + 30,
            }
            + settle_ms(budget)
    }
}

/// The settle before `rss_after_free_kib` is read, at a budget: 0.5 s in
/// the full run; 0.1 s with --quick (a settle per process, some 500
/// processes: 0.5 s would double the quick run).
pub fn settle_ms(budget: Budget) -> u64 {
    pick_u64(budget, 10, 100, 500)
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
        assert_eq!(WORKLOADS.len(), 17);
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
        // burst-idle: always its two threads.
        assert_eq!(find("burst-idle").unwrap().thread_counts(&[1, 4]), [2]);
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
                let args = w.args(b, None);
                let settle = args.iter().position(|a| a == "--settle-ms").unwrap();
                assert_eq!(args[settle + 1], settle_ms(b).to_string());
            }
        }
        let b = find("burst-idle").unwrap().args(Budget::Quick, None);
        assert!(b.windows(2).any(|w| w == ["--bytes", "268435456"]), "{b:?}");
        assert!(b.windows(2).any(|w| w == ["--idle-ms", "2500"]), "{b:?}");
        assert!(find("fixed").unwrap().missing().is_none());
        // realtime: samples of the small scenario and rounds of the large
        // one grow with the budget (the large blocks are 160–256 MiB each:
        // few rounds, even in the full run).
        let rt = find("realtime").unwrap();
        let value = |args: &[String], flag: &str| -> u64 {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1].parse().unwrap()
        };
        let mut last = (0, 0);
        for b in [Budget::Smoke, Budget::Quick, Budget::Full] {
            let args = rt.args(b, None);
            let now = (value(&args, "--samples"), value(&args, "--rounds"));
            assert!(now.0 > last.0 && now.1 > last.1, "{b:?}: {args:?}");
            assert!(now.1 <= 16, "{b:?}: {args:?}");
            last = now;
        }
        assert_eq!(value(&rt.args(Budget::Quick, None), "--rounds"), 4);
    }
}
