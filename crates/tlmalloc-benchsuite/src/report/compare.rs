//! Which figures tlmalloc wins, ties and loses against each other
//! allocator: the figures compared ([`compared_keys`]), the losses
//! ([`losses`]) and the per-allocator counts ([`tallies`]), with what counts
//! as a difference at all. Data only; `summary` writes them out.

use crate::results::{Record, Results};
use crate::stats::{advantage, Summary};
use crate::workloads::{metric, Family, Metric, WORKLOADS};

/// How much better another allocator must be to count as tlmalloc losing.
pub const LOSS_THRESHOLD: f64 = 1.05;

/// One way tlmalloc loses: a figure where another allocator's median is at
/// least [`LOSS_THRESHOLD`] times better.
#[derive(Clone, Debug, PartialEq)]
pub struct Loss {
    pub workload: String,
    pub threads: usize,
    pub param: String,
    pub metric: &'static str,
    pub ours: f64,
    /// (allocator, its median, how many times better, ranges apart)
    pub winners: Vec<(String, f64, f64, bool)>,
}

/// The memory figures every workload but `loop` is compared on, besides
/// its headline ones.
pub const MEMORY_KEYS: [&str; 2] = ["peak_rss_kib", "rss_after_free_kib"];

/// The figures of a workload that the summary and the losses compare: its
/// headline figures, and outside `loop` [`MEMORY_KEYS`].
pub fn compared_keys(w: &crate::workloads::Workload) -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = w.headline.to_vec();
    if w.family != Family::Loop {
        for k in MEMORY_KEYS {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

/// Every figure (headline figures, and peak RSS and RSS after free outside
/// `loop`) where some allocator beats tlmalloc by at least 5 %, most-lost
/// first.
pub fn losses(r: &Results) -> Vec<Loss> {
    let mut out = Vec::new();
    for w in WORKLOADS {
        let keys = compared_keys(w);
        for (threads, param) in r.cases(w.name) {
            let Some(ours) = r.record(w.name, "tlmalloc", threads, &param) else {
                continue;
            };
            for &key in &keys {
                let m = metric(key);
                let Some(o) = ours.summary.get(key) else {
                    continue;
                };
                let mut winners = Vec::new();
                for name in r.allocator_names().iter().filter(|n| *n != "tlmalloc") {
                    let Some(theirs) = r.record(w.name, name, threads, &param) else {
                        continue;
                    };
                    let Some(s) = theirs.summary.get(key) else {
                        continue;
                    };
                    let Some(adv) = advantage(s.median, o.median, m.higher_is_better) else {
                        continue;
                    };
                    if noise(&m, ours, theirs, o, s) {
                        continue;
                    }
                    if adv >= LOSS_THRESHOLD {
                        // Ranges of one or two runs say little: "apart" needs three.
                        let apart = s.n >= 3
                            && o.n >= 3
                            && if m.higher_is_better {
                                s.min > o.max
                            } else {
                                s.max < o.min
                            };
                        winners.push((name.clone(), s.median, adv, apart));
                    }
                }
                if !winners.is_empty() {
                    winners.sort_by(|a, b| b.2.total_cmp(&a.2));
                    out.push(Loss {
                        workload: w.name.into(),
                        threads,
                        param: param.clone(),
                        metric: key,
                        ours: o.median,
                        winners,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| b.winners[0].2.total_cmp(&a.winners[0].2));
    out
}

/// Whether the difference between two medians is below what the figure
/// can tell: memory under 1 MiB, or a latency within one step of the
/// timer (under 1.5 times the larger `timer_step_ns`, or
/// `timer_resolution_ns`, of the two records; 10 ns on some virtual
/// machines, where single samples are multiples of it).
fn noise(m: &Metric, ours: &Record, theirs: &Record, o: &Summary, s: &Summary) -> bool {
    let diff = (s.median - o.median).abs();
    match m.unit {
        "MiB" => diff < 1024.0,
        "ns" => {
            let step = |x: &Record| {
                ["timer_resolution_ns", "timer_step_ns"]
                    .iter()
                    .filter_map(|k| x.summary.get(*k))
                    .map(|t| t.median)
                    .fold(0.0, f64::max)
            };
            diff < 1.5 * step(ours).max(step(theirs))
        }
        _ => false,
    }
}

/// Per allocator: how many compared figures tlmalloc wins, ties and
/// loses (5 % either way), and the geometric mean of its throughput over
/// tlmalloc's across every throughput figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    pub allocator: String,
    pub compared: usize,
    pub tlmalloc_better: usize,
    pub within: usize,
    pub allocator_better: usize,
    /// Geometric mean of throughput ÷ tlmalloc's over the `loop` sizes,
    /// and over the other workloads' throughput figures; with their counts.
    pub geomean_loop: Option<f64>,
    pub loop_figures: usize,
    pub geomean_other: Option<f64>,
    pub other_figures: usize,
}

/// The [`Tally`] of every allocator but tlmalloc, over the same figures as
/// [`losses`].
pub fn tallies(r: &Results) -> Vec<Tally> {
    let mut out = Vec::new();
    for name in r.allocator_names().into_iter().filter(|n| n != "tlmalloc") {
        let mut t = Tally {
            allocator: name.clone(),
            compared: 0,
            tlmalloc_better: 0,
            within: 0,
            allocator_better: 0,
            geomean_loop: None,
            loop_figures: 0,
            geomean_other: None,
            other_figures: 0,
        };
        let (mut log_loop, mut log_other) = (0.0, 0.0);
        for w in WORKLOADS {
            let keys = compared_keys(w);
            for (threads, param) in r.cases(w.name) {
                let (Some(ours), Some(theirs)) = (
                    r.record(w.name, "tlmalloc", threads, &param),
                    r.record(w.name, &name, threads, &param),
                ) else {
                    continue;
                };
                for &key in &keys {
                    let m = metric(key);
                    let (Some(o), Some(s)) = (ours.summary.get(key), theirs.summary.get(key))
                    else {
                        continue;
                    };
                    let Some(adv) = advantage(s.median, o.median, m.higher_is_better) else {
                        continue;
                    };
                    t.compared += 1;
                    let small = noise(&m, ours, theirs, o, s);
                    if small || (adv < LOSS_THRESHOLD && adv > 1.0 / LOSS_THRESHOLD) {
                        t.within += 1;
                    } else if adv >= LOSS_THRESHOLD {
                        t.allocator_better += 1;
                    } else {
                        t.tlmalloc_better += 1;
                    }
                    if key == "mops" && adv > 0.0 {
                        if w.family == Family::Loop {
                            log_loop += adv.ln();
                            t.loop_figures += 1;
                        } else {
                            log_other += adv.ln();
                            t.other_figures += 1;
                        }
                    }
                }
            }
        }
        if t.loop_figures > 0 {
            t.geomean_loop = Some((log_loop / t.loop_figures as f64).exp());
        }
        if t.other_figures > 0 {
            t.geomean_other = Some((log_other / t.other_figures as f64).exp());
        }
        out.push(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{rec, sample};
    use crate::results::finish_records;

    #[test]
    fn losses_are_found_and_sorted() {
        let r = sample();
        let l = losses(&r);
        // jemalloc is 1.3× faster on fixed, loop, larson; its latency is
        // 1.3× lower; glibc's fragmentation ratio is half of tlmalloc's.
        assert!(l
            .iter()
            .any(|x| x.workload == "fixed" && x.metric == "mops" && x.winners[0].0 == "jemalloc"));
        let frag = l
            .iter()
            .find(|x| x.workload == "fragmentation" && x.metric == "rss_over_live")
            .unwrap();
        assert_eq!(frag.winners[0].0, "glibc");
        assert!((frag.winners[0].2 - 2.0).abs() < 1e-9);
        assert_eq!(l[0].winners[0].2, 2.0, "sorted by the biggest loss");
        // glibc never beats tlmalloc's throughput.
        assert!(!l
            .iter()
            .any(|x| x.metric == "mops" && x.winners.iter().any(|w| w.0 == "glibc")));
    }

    #[test]
    fn differences_within_the_timer_step_are_no_loss() {
        let mut r = sample();
        let mut records = Vec::new();
        for (a, p50, p999) in [("tlmalloc", 10.2, 14_000.0), ("glibc", 0.4, 900.0)] {
            records.push(rec(
                "fresh-tail",
                a,
                1,
                "",
                &[&[
                    ("p50_ns", p50),
                    ("p999_ns", p999),
                    ("timer_resolution_ns", 0.4),
                    ("timer_step_ns", 10.2),
                ]],
            ));
        }
        r.records = finish_records(records);
        let l = losses(&r);
        assert!(!l.iter().any(|x| x.metric == "p50_ns"), "{l:?}");
        assert!(l.iter().any(|x| x.metric == "p999_ns"), "{l:?}");
        let t = tallies(&r);
        assert_eq!(
            (t[0].compared, t[0].within, t[0].allocator_better),
            (2, 1, 1)
        );
    }

    #[test]
    fn tallies_count_wins_and_losses() {
        let r = sample();
        let t = tallies(&r);
        assert_eq!(t.len(), 2);
        let glibc = &t[0];
        assert_eq!(glibc.allocator, "glibc");
        assert_eq!(
            glibc.compared,
            glibc.tlmalloc_better + glibc.within + glibc.allocator_better
        );
        // glibc: half the throughput on loop ×2, and on fixed and larson.
        assert!((glibc.geomean_loop.unwrap() - 0.5).abs() < 1e-9);
        assert!((glibc.geomean_other.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!((glibc.loop_figures, glibc.other_figures), (2, 2));
        let je = &t[1];
        assert!((je.geomean_other.unwrap() - 1.3).abs() < 1e-9);
        assert!(je.allocator_better > 0);
    }
}
