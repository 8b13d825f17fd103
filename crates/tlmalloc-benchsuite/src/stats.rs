//! The driver's statistics: medians with their min–max, ratios against
//! tlmalloc, and the interleaved order in which runs are made.

use serde::{Deserialize, Serialize};

/// The median of `values` (the mean of the two middle ones for an even
/// count); None when empty. NaNs sort last.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One figure over the runs: median, min and max, the number of runs, and
/// the ratio of the median to tlmalloc's median of the same figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// `median / tlmalloc's median`; absent for tlmalloc itself's missing
    /// or zero figures.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vs_tlmalloc: Option<f64>,
}

/// Median, min and max of `values`; None when empty.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let median = median(values)?;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Summary {
        median,
        min,
        max,
        n: values.len(),
        vs_tlmalloc: None,
    })
}

/// `value / base`, or None when the ratio means nothing (base zero or
/// either not finite).
pub fn ratio(value: f64, base: f64) -> Option<f64> {
    if base == 0.0 || !base.is_finite() || !value.is_finite() {
        None
    } else {
        Some(value / base)
    }
}

/// One process to run: the `group`-th (workload, threads) group, its
/// `run`-th repetition, under the `allocator`-th allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub group: usize,
    pub run: usize,
    pub allocator: usize,
}

/// The order of all processes: for each (workload, threads) group in turn,
/// `runs` rounds, each round every allocator once in the given order
/// (A B C … A B C …), so that a slow phase of the machine hits every
/// allocator alike rather than all runs of one.
pub fn interleave(groups: usize, runs: usize, allocators: usize) -> Vec<Slot> {
    let mut order = Vec::with_capacity(groups * runs * allocators);
    for group in 0..groups {
        for run in 0..runs {
            for allocator in 0..allocators {
                order.push(Slot {
                    group,
                    run,
                    allocator,
                });
            }
        }
    }
    order
}

/// Whether `a` is better than `b` for a figure where higher (or lower) is
/// better.
pub fn better(a: f64, b: f64, higher_is_better: bool) -> bool {
    if higher_is_better {
        a > b
    } else {
        a < b
    }
}

/// How much better `other` is than `ours` as a factor ≥ 1 (1.25 = 25 %
/// better), or below 1 when it is worse.
pub fn advantage(other: f64, ours: f64, higher_is_better: bool) -> Option<f64> {
    if higher_is_better {
        ratio(other, ours)
    } else {
        ratio(ours, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.5]), Some(7.5));
        assert_eq!(median(&[]), None);
        // Order of the input does not matter, and the input is not changed.
        let v = [9.0, -1.0, 5.0, 5.0, 0.0];
        assert_eq!(median(&v), Some(5.0));
        assert_eq!(v, [9.0, -1.0, 5.0, 5.0, 0.0]);
    }

    #[test]
    fn summary_min_max() {
        let s = summarize(&[5.0, 1.0, 9.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (4.0, 1.0, 9.0, 4));
        assert_eq!(s.vs_tlmalloc, None);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 4.0), Some(0.25));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(ratio(1.0, f64::INFINITY), None);
        // Advantage: > 1 means the other allocator is better.
        assert_eq!(advantage(20.0, 10.0, true), Some(2.0)); // twice the throughput
        assert_eq!(advantage(5.0, 10.0, false), Some(2.0)); // half the latency
        assert_eq!(advantage(5.0, 10.0, true), Some(0.5));
        assert!(better(2.0, 1.0, true) && better(1.0, 2.0, false));
    }

    #[test]
    fn interleaving_order_is_a_b_c_a_b_c() {
        let order = interleave(2, 3, 3);
        assert_eq!(order.len(), 2 * 3 * 3);
        let allocs: Vec<usize> = order.iter().map(|s| s.allocator).collect();
        assert_eq!(
            allocs,
            [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
        );
        let runs: Vec<usize> = order.iter().take(9).map(|s| s.run).collect();
        assert_eq!(runs, [0, 0, 0, 1, 1, 1, 2, 2, 2]);
        // Every run of a group is done before the next group starts.
        assert!(order[..9].iter().all(|s| s.group == 0));
        assert!(order[9..].iter().all(|s| s.group == 1));
        // No allocator runs twice in a row within a group with several allocators.
        for w in order.windows(2) {
            if w[0].group == w[1].group {
                assert_ne!(w[0].allocator, w[1].allocator);
            }
        }
        assert!(interleave(0, 3, 3).is_empty());
    }
}
